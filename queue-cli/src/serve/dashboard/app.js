// The dashboard: plain JavaScript over the HTTP API, no build step.
// Everything a job holds (kind, payload, messages) reaches the page through
// text nodes only, never as HTML, and the server's Content-Security-Policy
// allows no script but this file.

const main = document.getElementById('main');
const notice = document.getElementById('notice');
const tokenForm = document.getElementById('token-form');
const tokenInput = document.getElementById('token-input');
const tokenButton = document.getElementById('token-button');
const TOKEN_KEY = 'queue-token';
const STATES = ['queued', 'processing', 'completed', 'errored', 'failed', 'canceled'];
let refreshTimer = null;
// Bumped by every navigation: a page's late answer (or its timer) paints
// only while its navigation is still the one shown, never over the page
// the person went to meanwhile.
let shown = 0;
// A notice set just before navigating survives that one navigation.
let keepNotice = false;

// --- The API ---------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

// Writes carry the token in a header, which no other site's page can make
// a browser send: that, and the server's origin check, keep them safe.
async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (token()) headers.Authorization = 'Bearer ' + token();
  const init = { method, headers, credentials: 'omit' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'network', 'the server did not answer (' + e.message + ')');
  }
  let data = null;
  try {
    data = await response.json();
  } catch (_) {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.code || 'http_' + response.status,
      error.message || response.statusText);
  }
  return data;
}

// --- Building the page -----------------------------------------------

// An element; children are nodes or text (always text, never HTML).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'class') el.className = value;
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) el.setAttribute(name, String(value));
  for (const child of children) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

function say(text, kind) {
  notice.hidden = !text;
  notice.className = 'notice' + (kind ? ' ' + kind : '');
  notice.textContent = text || '';
}

// What an error means for the person looking.
function explain(error) {
  if (error.status === 401) {
    showTokenForm();
    return 'This server needs a token: enter a read or admin token above.';
  }
  if (error.status === 403 && error.code === 'forbidden') {
    showTokenForm();
    return 'Your token may not do this: ' + error.message;
  }
  if (error.status === 503) return 'The database is unavailable; retrying. (' + error.message + ')';
  return error.message;
}

async function guarded(work) {
  try {
    await work();
    if (notice.classList.contains('error')) say('');
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    say(explain(error), 'error');
  }
}

function time(text) {
  if (!text) return '—';
  const d = new Date(text);
  return d.toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  if (seconds < 90) return Math.round(seconds) + ' s';
  if (seconds < 5400) return Math.round(seconds / 60) + ' min';
  if (seconds < 172800) return Math.round(seconds / 3600) + ' h';
  return Math.round(seconds / 86400) + ' d';
}

// A state badge, with the table's own value beside it when it differs.
function stateBadge(state, stored) {
  const shown = state || stored;
  return h('span', {},
    h('span', { class: 'state ' + (state || 'unknown'), 'data-state': shown }, shown),
    stored && stored !== state ? h('span', { class: 'stored-as' }, 'stored as ', h('code', {}, stored)) : null);
}

function jobLink(id) {
  return h('a', { href: '#/jobs/' + encodeURIComponent(id), class: 'mono' }, id);
}

// --- Token -------------------------------------------------------------

function showTokenForm() {
  tokenForm.hidden = false;
  tokenButton.hidden = true;
  tokenInput.focus();
}

function showTokenState() {
  tokenButton.textContent = token() ? 'Token ✓' : 'Token';
}

tokenButton.addEventListener('click', showTokenForm);
tokenForm.addEventListener('submit', (event) => {
  event.preventDefault();
  const value = tokenInput.value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  tokenInput.value = '';
  tokenForm.hidden = true;
  tokenButton.hidden = false;
  showTokenState();
  say('');
  route();
});
document.getElementById('token-forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  tokenForm.hidden = true;
  tokenButton.hidden = false;
  showTokenState();
  route();
});

// --- Overview ------------------------------------------------------------

async function overview() {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Overview'), h('p', { class: 'muted' }, 'Loading…'));
  // The timer's refresh leaves the page alone while a kind's limits are
  // being edited; a write's own reload repaints it.
  const load = async (force) => {
    const [stats, timeline, limits] = await Promise.all([
      api('GET', '/api/stats'),
      api('GET', '/api/timeline?minutes=60'),
      api('GET', '/api/limits'),
    ]);
    if (mine !== shown) return;
    if (!force && main.querySelector('#kinds details[open]')) return;
    main.replaceChildren(
      h('h1', {}, 'Overview'),
      stateCards(stats),
      h('div', { class: 'facts' },
        h('span', {}, 'Oldest waiting: ', h('b', { id: 'oldest' }, ago(stats.oldest_claimable_age_seconds))),
        h('span', {}, 'Stalled: ', h('b', { id: 'stalled' }, stats.stalled ?? 'unknown')),
        h('span', {}, 'As of ', time(stats.now)),
        stats.counts.some((c) => c.estimated)
          ? h('span', { id: 'estimated-note', class: 'muted' }, '≈ estimated: the table is too big to count every job on each refresh')
          : null),
      h('h2', {}, 'Last hour'),
      h('div', { class: 'panel chart' }, chart(timeline)),
      h('h2', {}, 'Kinds'),
      kindsTable(stats, timeline, limits, () => guarded(() => load(true))),
      h('h2', {}, 'Jobs by state and kind'),
      countsTable(stats));
  };
  await guarded(() => load(true));
  // Only if the overview is still what is shown: route() cleared the
  // timer of the last page when it navigated away, maybe before this.
  if (mine === shown) refreshTimer = setInterval(() => guarded(() => load(false)), 5000);
}

// A count as shown: "≈" before one estimated from the planner's statistics
// (a big table's finished jobs), with the reason on hover.
function figure(n, estimated) {
  if (!estimated) return n.toLocaleString('en');
  return h('span', { class: 'estimated', title: "estimated from the planner's statistics: the table is too big to count on every refresh" },
    '≈' + n.toLocaleString('en'));
}

function stateCards(stats) {
  const cards = [];
  const seen = new Set();
  for (const state of STATES) {
    const rows = stats.counts.filter((c) => c.state === state);
    const stored = [...new Set(rows.map((c) => c.stored_state))].filter((v) => v !== state);
    const total = rows.reduce((sum, c) => sum + c.count, 0);
    rows.forEach((c) => seen.add(c.stored_state));
    cards.push(h('a', { class: 'card', href: '#/jobs?state=' + state, 'data-card': state },
      h('div', { class: 'label' }, state),
      h('div', { class: 'n' }, figure(total, rows.some((c) => c.estimated))),
      stored.length ? h('div', { class: 'stored' }, 'stored as ', stored.join(', ')) : null));
  }
  // Values the mapping does not know, in the table's own words.
  for (const c of stats.counts.filter((c) => c.state === null)) {
    if (seen.has(c.stored_state)) continue;
    seen.add(c.stored_state);
    const same = stats.counts.filter((x) => x.stored_state === c.stored_state);
    const total = same.reduce((sum, x) => sum + x.count, 0);
    cards.push(h('div', { class: 'card' },
      h('div', { class: 'label' }, c.stored_state),
      h('div', { class: 'n' }, figure(total, same.some((x) => x.estimated))),
      h('div', { class: 'stored' }, 'not a mapped state')));
  }
  return h('div', { class: 'cards' }, cards);
}

// Each kind's waiting, running and failed jobs, whether it is paused (since
// when, by whom), and the button that pauses or resumes it.
// Per kind: jobs waiting, running and failed, completions per minute over
// the last five whole minutes, and the pause toggle.
function kindsTable(stats, timeline, limits, reload) {
  const kinds = new Map();
  const of = (kind) => {
    if (!kinds.has(kind)) kinds.set(kind, { waiting: 0, running: 0, failed: 0, done: 0, estimated: new Set() });
    return kinds.get(kind);
  };
  // The points before the current (partial) minute.
  const recent = timeline.points.slice(-6, -1);
  for (const point of recent) {
    for (const [kind, n] of Object.entries(point.completed_by_kind || {})) of(kind).done += n;
  }
  for (const c of stats.counts) {
    if (c.kind === null) continue;
    const k = of(c.kind);
    const column = c.state === 'queued' || c.state === 'errored' ? 'waiting'
      : c.state === 'processing' ? 'running' : c.state === 'failed' ? 'failed' : null;
    if (column === null) continue;
    k[column] += c.count;
    if (c.estimated) k.estimated.add(column);
  }
  const paused = new Map((stats.paused || []).map((p) => [p.kind, p]));
  for (const kind of paused.keys()) of(kind);
  const limited = new Map(limits.map((l) => [l.kind, l]));
  for (const kind of limited.keys()) of(kind);
  if (!kinds.size) return h('p', { class: 'muted' }, 'No kinds.');
  const toggle = (kind, pause) => h('button', {
    type: 'button',
    class: pause ? 'danger' : 'primary',
    'data-pause': kind,
    onclick: async () => {
      await guarded(async () => {
        await api('POST', '/api/kinds/' + encodeURIComponent(kind) + (pause ? '/pause' : '/resume'));
        say((pause ? 'Paused ' : 'Resumed ') + kind + '.', 'ok');
        await reload();
      });
    },
  }, pause ? 'Pause' : 'Resume');
  const num = (k, column) => h('td', { class: 'num' }, figure(k[column], k.estimated.has(column)));
  return h('table', { id: 'kinds' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Kind'), h('th', { class: 'num' }, 'Waiting'),
      h('th', { class: 'num' }, 'Running'), h('th', { class: 'num' }, 'Failed'),
      h('th', { class: 'num', title: 'completed per minute, over the last five whole minutes' }, 'Done / min'),
      h('th', {}, 'Limits'), h('th', {}, 'Status'), h('th', {}))),
    h('tbody', {}, [...kinds.keys()].sort().map((kind) => {
      const k = kinds.get(kind);
      const p = paused.get(kind);
      return h('tr', { 'data-kind': kind },
        h('td', {}, h('a', { href: '#/jobs?' + new URLSearchParams({ kind }) }, kind)),
        num(k, 'waiting'), num(k, 'running'), num(k, 'failed'),
        h('td', { class: 'num throughput' }, recent.length ? (Math.round(k.done / recent.length * 10) / 10).toLocaleString('en') : '—'),
        h('td', { class: 'limits' }, limitsEditor(kind, limited.get(kind), reload)),
        h('td', { class: 'pause-state' }, p
          ? h('span', { class: 'badge paused' }, 'paused ', time(p.since), ' by ', p.by)
          : h('span', { class: 'muted' }, 'running')),
        h('td', {}, toggle(kind, !p)));
    })));
}

// A kind's limits in words, and a form to change them (every process heeds
// a change within a second).
function limitsEditor(kind, limit, reload) {
  const field = (name, label, value, step) => h('label', {}, label,
    h('input', { name, type: 'number', min: step === 'any' ? '0' : '1', step, value: value ?? '', placeholder: 'none' }));
  const form = h('form', {
    class: 'limits-form',
    'data-limits': kind,
    onsubmit: async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const number = (name) => (data.get(name) === '' ? null : Number(data.get(name)));
      const body = { max_running: number('max_running'), per_second: number('per_second'), burst: number('burst') };
      await guarded(async () => {
        const set = await api('PUT', '/api/kinds/' + encodeURIComponent(kind) + '/limits', body);
        say(set.limits ? 'Limited ' + kind + ': ' + set.limits.description + '.' : kind + ' has no limits now.', 'ok');
        await reload();
      });
    },
  },
  field('max_running', 'At once', limit?.max_running, '1'),
  field('per_second', 'Per second', limit?.per_second, 'any'),
  field('burst', 'Burst', limit?.burst, '1'),
  h('button', { type: 'submit', class: 'primary' }, 'Save'));
  return h('details', {},
    h('summary', {}, limit ? limit.description : h('span', { class: 'muted' }, 'none')),
    form);
}

function countsTable(stats) {
  if (!stats.counts.length) return h('p', { class: 'muted' }, 'No jobs.');
  return h('table', { id: 'counts' },
    h('thead', {}, h('tr', {}, h('th', {}, 'State'), h('th', {}, 'Kind'), h('th', { class: 'num' }, 'Jobs'))),
    h('tbody', {}, stats.counts.map((c) => {
      const query = new URLSearchParams({ state: c.stored_state });
      if (c.kind !== null) query.set('kind', c.kind);
      return h('tr', {},
        h('td', {}, stateBadge(c.state, c.stored_state)),
        h('td', {}, c.kind === null ? h('span', { class: 'muted' }, '—') : h('a', { href: '#/jobs?' + query }, c.kind)),
        h('td', { class: 'num' }, figure(c.count, c.estimated)));
    })));
}

// Finished jobs per minute as stacked bars (left scale), the number of
// waiting jobs as a line (right scale).
function chart(timeline) {
  const points = timeline.points;
  const W = 960, H = 220, L = 48, R = 56, T = 12, B = 28;
  const w = W - L - R, hgt = H - T - B;
  const finished = points.map((p) => p.completed + p.failed + p.canceled);
  const maxFinished = Math.max(1, ...finished);
  const waits = points.map((p) => p.waiting).filter((v) => v !== null);
  const maxWaiting = Math.max(1, ...waits);
  const step = w / points.length;
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'Jobs finished per minute and jobs waiting, last hour' });
  svg.append(s('line', { class: 'axis', x1: L, y1: T + hgt, x2: L + w, y2: T + hgt }));
  for (const frac of [0.5, 1]) {
    const y = T + hgt - frac * hgt;
    svg.append(s('line', { class: 'axis', x1: L, y1: y, x2: L + w, y2: y, 'stroke-dasharray': '3 4' }));
    svg.append(s('text', { x: L - 6, y: y + 4, 'text-anchor': 'end' }, Math.round(maxFinished * frac).toLocaleString('en')));
    svg.append(s('text', { x: L + w + 6, y: y + 4 }, Math.round(maxWaiting * frac).toLocaleString('en')));
  }
  points.forEach((p, i) => {
    const x = L + i * step + 1;
    let y = T + hgt;
    for (const [value, kind] of [[p.completed, 'completed'], [p.failed, 'failed'], [p.canceled, 'canceled']]) {
      if (!value) continue;
      const height = (value / maxFinished) * hgt;
      y -= height;
      const bar = s('rect', { x, y, width: Math.max(1, step - 2), height, class: 'bar ' + kind });
      bar.append(s('title', {}, `${time(p.start)}: ${p.completed} completed, ${p.failed} failed, ${p.canceled} canceled`));
      svg.append(bar);
    }
  });
  let path = '';
  points.forEach((p, i) => {
    if (p.waiting === null) return;
    const x = L + i * step + step / 2;
    const y = T + hgt - (p.waiting / maxWaiting) * hgt;
    path += (path && points[i - 1] && points[i - 1].waiting !== null ? 'L' : 'M') + x.toFixed(1) + ' ' + y.toFixed(1);
    svg.append(s('circle', { cx: x, cy: y, r: 2.5, class: 'waiting' }));
  });
  if (path) svg.append(s('path', { d: path, class: 'waiting' }));
  for (const [i, label] of [[0, '−60 min'], [Math.floor(points.length / 2), '−30 min'], [points.length - 1, 'now']]) {
    if (!points[i]) continue;
    svg.append(s('text', { x: L + i * step + step / 2, y: H - 8, 'text-anchor': 'middle' }, label));
  }
  const legend = h('div', { class: 'legend' },
    h('span', {}, h('span', { class: 'swatch completed' }), 'completed / min'),
    h('span', {}, h('span', { class: 'swatch failed' }), 'failed / min'),
    h('span', {}, h('span', { class: 'swatch canceled' }), 'canceled / min'),
    h('span', {}, h('span', { class: 'swatch waiting' }), 'waiting (right scale; sampled since the server started)'));
  const note = timeline.finish_times_kept ? null
    : h('p', { class: 'muted' }, 'This table keeps no finish times, so finished jobs cannot be counted per minute.');
  return h('div', {}, svg, legend, note);
}

// --- Job list ------------------------------------------------------------

async function jobs(params) {
  const mine = shown;
  const filters = filterForm(params);
  main.replaceChildren(h('h1', {}, 'Jobs'), filters, h('p', { class: 'muted' }, 'Loading…'));
  await guarded(async () => {
    const query = new URLSearchParams();
    for (const name of ['state', 'kind', 'failure_contains', 'order', 'after']) {
      if (params.get(name)) query.set(name, params.get(name));
    }
    query.set('limit', '25');
    const page = await api('GET', '/api/jobs?' + query);
    if (mine !== shown) return;
    const rows = page.jobs.map((job) => h('tr', { 'data-id': job.id },
      h('td', {}, jobLink(job.id)),
      h('td', {}, job.kind === null ? '—' : job.kind),
      h('td', {}, stateBadge(job.state, job.stored_state)),
      h('td', { class: 'num' }, job.priority === null ? '—' : job.priority),
      h('td', {}, time(job.queued_at)),
      h('td', {}, time(job.finished_at)),
      h('td', { class: 'failure', title: job.failure_message || '' }, job.failure_message || '')));
    const searched = page.searched === undefined || page.searched === null ? null
      : h('p', { class: 'muted', id: 'searched' },
        `Searched ${page.searched.toLocaleString()} jobs, back to job ${page.next}, without filling the page: ` +
        'no index serves this filter. The next page searches on.');
    const table = page.jobs.length
      ? h('table', { id: 'jobs' },
        h('thead', {}, h('tr', {}, ['ID', 'Kind', 'State', 'Priority', 'Queued', 'Finished', 'Failure'].map((t) => h('th', {}, t)))),
        h('tbody', {}, rows))
      : h('p', { class: 'muted', id: 'no-jobs' }, 'No jobs match.');
    const first = new URLSearchParams(params);
    first.delete('after');
    const next = new URLSearchParams(params);
    if (page.next !== null) next.set('after', page.next);
    const pager = h('div', { class: 'pager' },
      params.get('after') ? h('a', { href: '#/jobs?' + first }, '← First page') : null,
      page.next !== null ? h('a', { href: '#/jobs?' + next, id: 'next-page' }, searched ? 'Search on →' : 'Next page →') : null);
    // replaceChildren writes a null as the text "null": only the parts
    // this page has.
    const parts = [h('h1', {}, 'Jobs'), filters, bulkBar(params, page.jobs.length > 0), searched, table, pager];
    main.replaceChildren(...parts.filter((part) => part !== null));
  });
}

// "All matching" writes: each starts a tracked operation over every job the
// filter matches (not only this page), then shows its progress.
function bulkBar(params, any) {
  if (!any) return null;
  const filter = new URLSearchParams();
  for (const name of ['state', 'kind', 'failure_contains']) {
    if (params.get(name)) filter.set(name, params.get(name));
  }
  const described = filter.toString() ? [...filter].map(([k, v]) => k + ' ' + v).join(', ') : 'every job';
  const start = (label, action, question, body, cls) => h('button', {
    class: cls,
    id: 'bulk-' + action,
    onclick: async () => {
      if (!window.confirm(question + ' (' + described + ')? It runs in the background, in batches; you can abort it.')) return;
      try {
        const op = await api('POST', '/api/operations/' + action + (filter.toString() ? '?' + filter : ''), body);
        say(label + ': operation ' + op.id + ' started over ' + op.total + ' jobs.', 'ok');
        keepNotice = true;
        location.hash = '#/operations/' + op.id;
      } catch (error) {
        if (!(error instanceof ApiError)) throw error;
        say(explain(error), 'error');
      }
    },
  }, label);
  return h('div', { class: 'actions bulk' },
    h('span', { class: 'muted' }, 'All jobs matching the filter, on every page:'),
    start('Retry all matching', 'retry', 'Retry every failed, errored and canceled job matching', undefined, 'primary'),
    start('Cancel all matching', 'cancel', 'Cancel every waiting job matching, and ask running ones to stop', undefined, ''),
    start('Delete all matching', 'delete', 'Delete every job matching; this cannot be undone', undefined, 'danger'));
}

// --- Operations ----------------------------------------------------------

const OPEN = ['pending', 'running', 'interrupted'];

function progressBar(op) {
  const percent = Math.round(op.progress * 1000) / 10;
  const fill = h('div', { class: 'fill ' + op.state });
  // Through the CSSOM: the policy allows no style attribute.
  fill.style.width = percent + '%';
  return h('div', { class: 'progress', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': op.total, 'aria-valuenow': op.done },
    fill,
    h('span', { class: 'label' }, op.done + ' / ' + op.total + ' (' + percent + '%)'));
}

function abortButton(op, after) {
  if (!OPEN.includes(op.state)) return null;
  return h('button', {
    class: 'danger',
    'data-abort': op.id,
    onclick: async () => {
      if (!window.confirm('Abort operation ' + op.id + '? Its runner stops after the batch under way; jobs already changed stay changed.')) return;
      try {
        await api('POST', '/api/operations/' + op.id + '/abort');
        say('Operation ' + op.id + ' aborted.', 'ok');
        await after();
      } catch (error) {
        if (!(error instanceof ApiError)) throw error;
        say(explain(error), 'error');
      }
    },
  }, 'Abort');
}

function filterText(filter) {
  const parts = [];
  for (const [name, value] of Object.entries(filter || {})) {
    if (value === null || value === undefined) continue;
    parts.push(name + ' ' + (Array.isArray(value) ? value.join(' or ') : typeof value === 'object' ? JSON.stringify(value) : value));
  }
  return parts.length ? parts.join(', ') : 'every job';
}

// Bulk operations, newest first; refreshed every second while one is open.
async function operations() {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Operations'), h('p', { class: 'muted' }, 'Loading…'));
  const load = async () => {
    const list = await api('GET', '/api/operations?limit=50');
    if (mine !== shown) return;
    main.replaceChildren(
      h('h1', {}, 'Operations'),
      list.length
        ? h('table', { id: 'operations' },
          h('thead', {}, h('tr', {}, ['#', 'Action', 'State', 'Progress', 'By', 'Started', 'Jobs', ''].map((t) => h('th', {}, t)))),
          h('tbody', {}, list.map((op) => h('tr', { 'data-operation': op.id },
            h('td', { class: 'num' }, h('a', { href: '#/operations/' + op.id }, op.id)),
            h('td', {}, h('b', {}, op.action)),
            h('td', {}, h('span', { class: 'op-state ' + op.state }, op.state)),
            h('td', { class: 'progress-cell' }, progressBar(op)),
            h('td', {}, op.by),
            h('td', {}, time(op.created_at)),
            h('td', { class: 'op-filter' }, filterText(op.filter)),
            h('td', {}, abortButton(op, load))))))
        : h('p', { class: 'muted' }, 'No operations yet: start one with "Retry all matching" on the Jobs page, or queue retry … --detach.'));
  };
  await guarded(load);
  if (mine === shown) refreshTimer = setInterval(() => guarded(load), 1000);
}

// One operation, its progress refreshed every second until it ends.
async function operation(id) {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Operation ', id), h('p', { class: 'muted' }, 'Loading…'));
  const load = async () => {
    const op = await api('GET', '/api/operations/' + encodeURIComponent(id));
    if (mine !== shown) return;
    const field = (name, value) => [h('dt', {}, name), h('dd', {}, value === null || value === undefined ? '—' : value)];
    main.replaceChildren(
      h('h1', {}, 'Operation ', h('span', { class: 'mono' }, op.id), h('span', { class: 'op-state ' + op.state, id: 'op-state' }, op.state)),
      h('div', { class: 'panel', id: 'op-progress' }, progressBar(op)),
      h('div', { class: 'actions op-actions' }, abortButton(op, load)),
      h('dl', { class: 'fields panel' },
        field('Action', op.action + (op.reset_attempts ? ' (attempts reset)' : '')),
        op.reason ? field('Reason', op.reason) : null,
        field('Jobs', filterText(op.filter)),
        field('Done', op.done + ' of ' + op.total),
        field('Batch', op.batch),
        field('Started by', op.by),
        field('Runner', op.runner),
        field('Recorded', time(op.created_at)),
        field('Started', time(op.started_at)),
        field('Last batch', time(op.updated_at)),
        field('Ended', time(op.finished_at)),
        field('Note', op.message)));
    if (!OPEN.includes(op.state)) {
      clearInterval(refreshTimer);
      refreshTimer = null;
    }
  };
  await guarded(load);
  if (mine === shown) refreshTimer = setInterval(() => guarded(load), 1000);
}

function filterForm(params) {
  const state = h('select', { name: 'state', id: 'filter-state' },
    h('option', { value: '' }, 'any'),
    STATES.map((st) => h('option', { value: st, selected: params.get('state') === st }, st)));
  const kind = h('input', { name: 'kind', id: 'filter-kind', value: params.get('kind') || '', placeholder: 'any kind' });
  const failure = h('input', { name: 'failure_contains', id: 'filter-failure', value: params.get('failure_contains') || '', placeholder: 'text in the failure' });
  const order = h('select', { name: 'order', id: 'filter-order' },
    h('option', { value: 'newest' }, 'newest first'),
    h('option', { value: 'oldest', selected: params.get('order') === 'oldest' }, 'oldest first'));
  // A stored value the standard names do not cover (a foreign table's own
  // word) stays selectable.
  const current = params.get('state');
  if (current && !STATES.includes(current)) {
    state.append(h('option', { value: current, selected: true }, current));
  }
  return h('form', {
    class: 'filters',
    onsubmit: (event) => {
      event.preventDefault();
      const query = new URLSearchParams();
      for (const [name, input] of [['state', state], ['kind', kind], ['failure_contains', failure], ['order', order]]) {
        if (input.value && !(name === 'order' && input.value === 'newest')) query.set(name, input.value);
      }
      location.hash = '#/jobs' + (query.toString() ? '?' + query : '');
    },
  },
  h('label', {}, 'State', state),
  h('label', {}, 'Kind', kind),
  h('label', {}, 'Failure contains', failure),
  h('label', {}, 'Order', order),
  h('button', { type: 'submit', class: 'primary', id: 'filter-apply' }, 'Filter'));
}

// --- One job -------------------------------------------------------------

async function job(id) {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Job ', id), h('p', { class: 'muted' }, 'Loading…'));
  await guarded(async () => {
    const j = await api('GET', '/api/jobs/' + encodeURIComponent(id));
    if (mine !== shown) return;
    // `ask` is a confirmation (true to go on) or, for a write that takes
    // a body, the body (null to stop).
    const act = (label, method, path, ask, cls) => h('button', {
      class: cls,
      id: 'action-' + label.toLowerCase(),
      onclick: async () => {
        const body = ask ? ask() : undefined;
        if (body === false || body === null) return;
        try {
          const result = await api(method, path, body === true ? undefined : body);
          if (method === 'DELETE') {
            say('Job ' + id + ' deleted.', 'ok');
            keepNotice = true;
            location.hash = '#/jobs';
            return;
          }
          say(label + ': ' + (result.changed ? 'done.' : result.stop_requested ? 'asked the running attempt to stop.' : 'nothing changed.'), 'ok');
          await job(id);
        } catch (error) {
          if (!(error instanceof ApiError)) throw error;
          say(explain(error), 'error');
        }
      },
    }, label);
    const base = '/api/jobs/' + encodeURIComponent(id);
    const retryable = ['failed', 'errored', 'canceled'].includes(j.state);
    const cancelable = ['queued', 'errored', 'processing'].includes(j.state);
    const field = (name, value) => [h('dt', {}, name), h('dd', {}, value === null || value === undefined ? '—' : value)];
    const logs = j.execution_logs.length
      ? h('ol', { class: 'log' }, j.execution_logs.map((entry) =>
        h('li', {}, entry && typeof entry === 'object' && 'message' in entry
          ? [h('span', { class: 'muted mono' }, time(entry.at), ' ', entry.key || ''), ' ', String(entry.message)]
          : h('code', {}, JSON.stringify(entry)))))
      : h('p', { class: 'muted' }, 'No log entries.');
    main.replaceChildren(
      h('h1', {}, 'Job ', h('span', { class: 'mono' }, j.id), stateBadge(j.state, j.stored_state)),
      h('div', { class: 'actions' },
        retryable ? act('Retry', 'POST', base + '/retry', null, 'primary') : null,
        cancelable ? act('Cancel', 'POST', base + '/cancel', null, '') : null,
        // A stuck job: ends failed now, its running attempt fenced out.
        cancelable ? act('Fail', 'POST', base + '/fail', () => {
          const reason = window.prompt('Fail job ' + id + ' now? Its running attempt is fenced out. The reason (its failure message):');
          return reason && reason.trim() ? { reason } : null;
        }, 'danger') : null,
        act('Delete', 'DELETE', base, () => window.confirm('Delete job ' + id + '? This cannot be undone.'), 'danger')),
      h('div', { class: 'two' },
        h('div', {},
          h('h2', {}, 'Details'),
          h('dl', { class: 'fields panel' },
            field('Kind', j.kind),
            field('State', stateBadge(j.state, j.stored_state)),
            field('Priority', j.priority),
            field('Failed attempts', j.num_failures),
            field('Attempt limit', j.max_attempts),
            ...(j.attempts_left === null ? [] : [field('Attempts left', j.attempts_left)]),
            field('Unique key', j.unique_key === null ? null : h('code', {}, j.unique_key)),
            field('Expires', j.expires_at ? time(j.expires_at) : null),
            field('At most once', j.at_most_once ? 'yes' : 'no'),
            field('Resets (stalled attempts)', j.num_resets),
            field('Queued', time(j.queued_at)),
            field('Runs after', j.process_after ? time(j.process_after) : null),
            field('Started', time(j.started_at)),
            field('Last heartbeat', j.last_heartbeat_at ? time(j.last_heartbeat_at) : null),
            field('Finished', time(j.finished_at)),
            field('Worker', j.worker_hostname),
            field('Stop requested', j.cancel ? 'yes' : 'no'))),
        h('div', {},
          h('h2', {}, 'Payload'),
          h('pre', { id: 'payload' }, j.payload === null ? '—' : JSON.stringify(j.payload, null, 2)),
          j.failure_message ? [h('h2', {}, 'Failure'), h('pre', { class: 'failure', id: 'failure' }, j.failure_message)] : null,
          h('h2', {}, 'Execution log'),
          logs)));
  });
}

// --- Schedules -----------------------------------------------------------

// The periodic jobs this server enqueues: when, the next run, the last
// run's job and how it ended.
async function schedules() {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Schedules'), h('p', { class: 'muted' }, 'Loading…'));
  const load = async () => {
    const list = await api('GET', '/api/schedules');
    if (mine !== shown) return;
    const last = (s) => {
      if (!s.last) return h('span', { class: 'muted' }, '—');
      if (s.last.job_id === null) {
        return [time(s.last.at), ' ', h('span', { class: 'muted' }, 'not enqueued (no scheduler ran then)')];
      }
      return [time(s.last.at), ' ', jobLink(s.last.job_id), ' ', stateBadge(s.last.state, s.last.state)];
    };
    main.replaceChildren(
      h('h1', {}, 'Schedules'),
      list.length
        ? h('table', { id: 'schedules' },
          h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Kind'), h('th', {}, 'When'),
            h('th', {}, 'Next run'), h('th', {}, 'Last run'))),
          h('tbody', {}, list.map((s) => h('tr', { 'data-schedule': s.name },
            h('td', {}, s.name),
            h('td', {}, h('a', { href: '#/jobs?' + new URLSearchParams({ kind: s.kind }) }, s.kind)),
            h('td', {}, h('code', {}, s.when)),
            h('td', { class: 'next-run' }, s.next_at ? time(s.next_at) : h('span', { class: 'muted' }, 'none')),
            h('td', { class: 'last-run' }, last(s))))))
        : h('p', { class: 'muted' }, 'This server runs no schedules: add [[schedules]] to its config file.'));
  };
  await guarded(load);
  if (mine === shown) refreshTimer = setInterval(() => guarded(load), 5000);
}

// --- Workers -------------------------------------------------------------

// The worker processes alive now (beat within the stalled age).
async function workers() {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Workers'), h('p', { class: 'muted' }, 'Loading…'));
  const load = async () => {
    const list = await api('GET', '/api/workers');
    if (mine !== shown) return;
    main.replaceChildren(
      h('h1', {}, 'Workers'),
      list.length
        ? h('table', { id: 'workers' },
          h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Host'), h('th', { class: 'num' }, 'PID'),
            h('th', {}, 'Kinds'), h('th', { class: 'num' }, 'In flight'), h('th', {}, 'Started'), h('th', {}, 'Last seen'))),
          h('tbody', {}, list.map((w) => h('tr', { 'data-worker': w.name },
            h('td', {}, w.name),
            h('td', {}, w.host),
            h('td', { class: 'num' }, w.pid),
            h('td', { class: 'kinds' }, w.kinds.length ? w.kinds.join(', ') : h('span', { class: 'muted' }, 'any')),
            h('td', { class: 'num in-flight' }, w.in_flight + ' / ' + w.handlers),
            h('td', {}, time(w.started_at)),
            h('td', { class: 'last-seen' }, time(w.last_seen_at))))))
        : h('p', { class: 'muted' }, 'No worker has beaten within the stalled age.'));
  };
  await guarded(load);
  if (mine === shown) refreshTimer = setInterval(() => guarded(load), 5000);
}

// --- Audit log -----------------------------------------------------------

// Every write through the API and the CLI, newest first, a page at a time.
async function audit(params) {
  const mine = shown;
  main.replaceChildren(h('h1', {}, 'Audit log'), h('p', { class: 'muted' }, 'Loading…'));
  await guarded(async () => {
    const query = new URLSearchParams({ limit: '50' });
    if (params.get('before')) query.set('before', params.get('before'));
    const page = await api('GET', '/api/audit?' + query);
    if (mine !== shown) return;
    const rows = page.entries.map((e) => h('tr', { 'data-audit': e.id, class: e.ok ? '' : 'failed-entry' },
      h('td', { class: 'num mono' }, e.id),
      h('td', {}, time(e.at)),
      h('td', {}, e.actor),
      h('td', {}, h('b', {}, e.action)),
      h('td', {}, h('code', {}, JSON.stringify(e.target))),
      h('td', {}, e.ok ? null : h('span', { class: 'state failed' }, 'failed'), ' ', e.outcome)));
    main.replaceChildren(
      h('h1', {}, 'Audit log'),
      page.entries.length
        ? h('table', { id: 'audit' },
          h('thead', {}, h('tr', {}, h('th', { class: 'num' }, '#'), h('th', {}, 'When'), h('th', {}, 'Who'),
            h('th', {}, 'Action'), h('th', {}, 'Target'), h('th', {}, 'Outcome'))),
          h('tbody', {}, rows))
        : h('p', { class: 'muted' }, 'No entries.'),
      ...(page.next === null ? [] : [h('p', {}, h('a', { href: '#/audit?before=' + page.next }, 'Older entries →'))]));
  });
}

// --- Routing -------------------------------------------------------------

function route() {
  shown += 1;
  clearInterval(refreshTimer);
  refreshTimer = null;
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  const section = ['jobs', 'operations', 'audit', 'schedules', 'workers'].find((s) => path.startsWith('/' + s)) || 'overview';
  for (const a of document.querySelectorAll('[data-nav]')) {
    a.classList.toggle('active', a.dataset.nav === section);
  }
  if (path === '/' || path === '') return overview();
  if (path === '/jobs') return jobs(params);
  if (path === '/audit') return audit(params);
  if (path === '/schedules') return schedules();
  if (path === '/workers') return workers();
  if (path === '/operations') return operations();
  if (path.startsWith('/operations/')) return operation(decodeURIComponent(path.slice('/operations/'.length)));
  if (path.startsWith('/jobs/')) return job(decodeURIComponent(path.slice('/jobs/'.length)));
  main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/' }, 'Back to the overview')));
  return undefined;
}

window.addEventListener('hashchange', () => {
  if (!keepNotice) say('');
  keepNotice = false;
  route();
});
showTokenState();
route();
