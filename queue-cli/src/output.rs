//! How the commands print: aligned tables, relative times, cut text, JSON,
//! and progress bars on a terminal.
//!
//! The table is written here rather than with a table crate: plain columns
//! separated by two spaces, no borders and no terminal-width logic, which
//! is all `queue` prints and about thirty lines.

use std::io::{IsTerminal, Write};

use chrono::{DateTime, TimeDelta, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A table of text cells, printed with aligned columns.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// Columns aligned to the right (numbers).
    right: Vec<usize>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: Vec<&'static str>) -> Self {
        Table {
            header,
            rows: Vec::new(),
            right: Vec::new(),
        }
    }

    /// Aligns column `index` to the right.
    pub fn right(mut self, index: usize) -> Self {
        self.right.push(index);
        self
    }

    /// Adds a row; each cell is made [`printable_line`].
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.iter().map(|c| printable_line(c)).collect());
    }

    /// Prints the table; nothing but the header if it has no rows.
    pub fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .chain([self.header[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                if self.right.contains(&i) {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < row.len() {
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// A span of time in its largest unit: `45s`, `12m`, `3h`, `2d`.
pub fn span(delta: TimeDelta) -> String {
    let s = delta.num_seconds().abs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `at` relative to `now`: `3m ago`, `in 2h`, or `-` for none.
pub fn relative(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match at {
        None => "-".into(),
        Some(at) if at <= now => format!("{} ago", span(now - at)),
        Some(at) => format!("in {}", span(at - now)),
    }
}

/// `n jobs`, or `1 job`.
pub fn jobs(n: impl Into<u64>) -> String {
    match n.into() {
        1 => "1 job".into(),
        n => format!("{n} jobs"),
    }
}

/// `text` with every character that could drive a terminal written as an
/// escape (`\u{1b}`): C0 and C1 controls but newlines and tabs, DEL, and
/// the bidirectional overrides that reorder what a line shows. Job data
/// (kinds, keys, payloads, failures, logs) goes through this before it is
/// printed, so that an ANSI sequence in a payload reaches the operator as
/// text, not as a command to their terminal.
pub fn printable(text: &str) -> String {
    escaped(text, |c| c == '\n' || c == '\t')
}

/// [`printable`], on one line: newlines and tabs are escaped too.
pub fn printable_line(text: &str) -> String {
    escaped(text, |_| false)
}

fn escaped(text: &str, keep: impl Fn(char) -> bool) -> String {
    let unsafe_char = |c: char| {
        (c.is_control() && !keep(c))
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` on one line, cut to `max` characters with an ellipsis.
pub fn cut(text: &str, max: usize) -> String {
    let one_line: String = printable(text)
        .chars()
        .map(|c| if c == '\n' || c == '\t' { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// Prints `value` as pretty JSON.
pub fn json(out: &mut impl Write, value: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A progress bar over `total` jobs on standard error, shown only when it
/// is a terminal and the output is for a person.
pub fn progress(total: u64, what: &str, for_person: bool) -> ProgressBar {
    if !for_person || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {human_pos}/{human_len} jobs, {eta} left")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_printed_as_escapes() {
        assert_eq!(printable("plain text, ünïcode"), "plain text, ünïcode");
        assert_eq!(printable("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(printable("a\nb\tc"), "a\nb\tc", "newlines and tabs stay");
        assert_eq!(printable_line("a\nb"), "a\\u{a}b");
        assert_eq!(printable("\u{9b}2J \u{7f}"), "\\u{9b}2J \\u{7f}");
        assert_eq!(printable("\u{202e}gnp.exe"), "\\u{202e}gnp.exe");
        assert_eq!(cut("a\u{7}b\nc", 20), "a\\u{7}b c");
        let mut table = Table::new(vec!["KIND"]);
        table.row(vec!["\u{1b}]0;title\u{7}".into()]);
        let mut out = Vec::new();
        table.print(&mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains('\u{1b}'), "{out:?}");
    }

    #[test]
    fn tables_align_columns_and_numbers() {
        let mut table = Table::new(vec!["STATE", "KIND", "COUNT"]).right(2);
        table.row(vec!["queued".into(), "email".into(), "12".into()]);
        table.row(vec!["failed".into(), "resize-image".into(), "3".into()]);
        let mut out = Vec::new();
        table.print(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "STATE   KIND          COUNT\n\
             queued  email            12\n\
             failed  resize-image      3\n"
        );
    }

    #[test]
    fn times_read_relative_to_now() {
        let now = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::days(100);
        assert_eq!(relative(Some(now - TimeDelta::seconds(45)), now), "45s ago");
        assert_eq!(relative(Some(now - TimeDelta::minutes(125)), now), "2h ago");
        assert_eq!(relative(Some(now + TimeDelta::days(3)), now), "in 3d");
        assert_eq!(relative(None, now), "-");
    }

    #[test]
    fn long_text_is_cut_to_one_line() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("line one\nline two", 12), "line one li…");
    }
}
