// The dashboard of `queue serve` in headless Chromium, as a person uses it.
// Run by `cargo xtask test-pg` (xtask/src/dashboard_test.rs), which seeds
// the table, starts the server and passes, in the environment:
//   BASE          the server, http://127.0.0.1:PORT
//   READ_TOKEN    a read-only token; ADMIN_TOKEN an admin one;
//   OPERATE_TOKEN one with the operate role, named on-call
//   HOSTILE_ID    the key of a failed job whose payload and failure hold HTML
//   FAILED_COUNT  how many jobs failed
//   BULK_COUNT    how many canceled jobs of kind bulk_import wait for a
//                 retry by filter
//   FOREIGN_BASE  a second server, over a foreign table whose failed state
//                 is stored as "broken"
//   SHOTS         where the screenshots go
//   CHROMIUM      the browser (default /usr/bin/chromium)
// Every step says what it checks; the first that fails ends the run with
// its message and a screenshot of the page as it was.

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { mkdtempSync, rmSync } from 'node:fs';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const BASE = env('BASE');
const FOREIGN_BASE = env('FOREIGN_BASE');
const READ_TOKEN = env('READ_TOKEN');
const ADMIN_TOKEN = env('ADMIN_TOKEN');
const OPERATE_TOKEN = env('OPERATE_TOKEN');
const HOSTILE_ID = env('HOSTILE_ID');
const FAILED_COUNT = Number(env('FAILED_COUNT'));
const BULK_COUNT = Number(env('BULK_COUNT'));
const SHOTS = env('SHOTS');
mkdirSync(SHOTS, { recursive: true });

function check(condition, message) {
  if (!condition) throw new Error(message);
}

const profile = mkdtempSync(join(tmpdir(), 'queue-dashboard-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
  viewport: { width: 1280, height: 860 },
});
const page = context.pages()[0] || await context.newPage();
const problems = [];
page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
page.on('console', (message) => {
  if (message.type() === 'error' && !/status of 40[13]/.test(message.text())) {
    problems.push(`console error: ${message.text()}`);
  }
});
// Confirmations are accepted; a prompt (a force-fail's reason) is answered.
const REASON = 'stuck on a dead socket';
page.on('dialog', (dialog) => (dialog.type() === 'prompt' ? dialog.accept(REASON) : dialog.accept()));

let step = '';
async function run(name, body) {
  step = name;
  process.stdout.write(`dashboard: ${name} ... `);
  await body();
  check(problems.length === 0, problems.join('\n'));
  console.log('ok');
}

try {
  await run('the overview asks for a token, then shows the counts with a read token', async () => {
    await page.goto(BASE + '/');
    await page.locator('#token-form').waitFor({ state: 'visible' });
    check(/needs a token/.test(await page.locator('#notice').textContent()), 'a 401 explains that a token is needed');
    await page.fill('#token-input', READ_TOKEN);
    await page.click('#token-form button[type=submit]');
    const failedCard = page.locator('[data-card=failed] .n');
    await failedCard.waitFor();
    await page.waitForFunction((n) => document.querySelector('[data-card=failed] .n').textContent === String(n), FAILED_COUNT);
    check(await page.locator('#counts tbody tr').count() >= 3, 'the counts table has a row per state and kind');
    check(await page.locator('.chart svg rect').count() > 0, 'the chart draws the finished jobs as bars');
    await page.waitForSelector('.chart svg circle');
    const throughput = Number(await page.locator('#kinds tr[data-kind="send_email"] .throughput').textContent());
    check(throughput > 0, `the kinds table shows send_email's completions per minute: ${throughput}`);
    await page.screenshot({ path: join(SHOTS, 'dashboard-overview.png'), fullPage: true });
  });

  await run('the job list filters to failed jobs', async () => {
    await page.click('a[data-nav=jobs]');
    await page.locator('#jobs tbody tr').first().waitFor();
    await page.selectOption('#filter-state', 'failed');
    await page.click('#filter-apply');
    await page.waitForFunction(() => location.hash.includes('state=failed'));
    await page.waitForFunction((n) => {
      const rows = document.querySelectorAll('#jobs tbody tr');
      return rows.length === n && [...rows].every((r) => r.querySelector('[data-state]').dataset.state === 'failed');
    }, FAILED_COUNT);
  });

  await run('a job with HTML in its payload and failure shows it as text, never runs it', async () => {
    await page.click(`#jobs tr[data-id="${HOSTILE_ID}"] a`);
    await page.locator('#payload').waitFor();
    const payload = await page.locator('#payload').textContent();
    check(payload.includes('<script>window.__pwned = 1</script>'), `the payload is shown as text: ${payload}`);
    check((await page.locator('#failure').textContent()).includes('<img src=x'), 'the failure message is shown as text');
    check(await page.locator('#payload script, #payload img, #failure img, #failure script').count() === 0,
      'no element was made from the payload');
    check(await page.evaluate(() => window.__pwned) === undefined, 'no script from the payload ran');
    check(/"title": "<b>bold<\/b>"/.test(payload), 'the payload is formatted JSON');
    await page.screenshot({ path: join(SHOTS, 'dashboard-job.png'), fullPage: true });
  });

  await run('a read token cannot retry; an admin token can, and the job moves to queued', async () => {
    await page.click('#action-retry');
    await page.waitForFunction(() => /needs an operate token/.test(document.querySelector('#notice').textContent));
    await page.fill('#token-input', ADMIN_TOKEN);
    await page.click('#token-form button[type=submit]');
    await page.locator('#action-retry').waitFor();
    await page.click('#action-retry');
    await page.waitForFunction(() => document.querySelector('h1 [data-state]')?.dataset.state === 'queued');
    check(await page.locator('#action-retry').count() === 0, 'a queued job offers no retry');
  });

  await run('the retried job has left the failed list', async () => {
    await page.goto(BASE + '/#/jobs?state=failed');
    await page.waitForFunction((n) => document.querySelectorAll('#jobs tbody tr').length === n, FAILED_COUNT - 1);
    check(await page.locator(`#jobs tr[data-id="${HOSTILE_ID}"]`).count() === 0, 'the retried job is not listed as failed');
    await page.goto(BASE + '/#/');
    await page.waitForFunction((n) => document.querySelector('[data-card=failed] .n')?.textContent === String(n), FAILED_COUNT - 1);
  });

  await run('a page whose search stopped early says how far it read and searches on from there', async () => {
    // The store stops a failure text search after 50,000 jobs where no
    // trigram index serves it (tested against Postgres in Rust); this
    // table is too small for that, so the API's documented answer is
    // played to the page as the server would send it.
    await page.route('**/api/jobs?*', async (route) => {
      const url = new URL(route.request().url());
      if (url.searchParams.get('failure_contains') !== 'needle') return route.fallback();
      const after = url.searchParams.get('after');
      const body = after === '4242'
        ? { jobs: [], next: null }
        : { jobs: [], next: '4242', searched: 50000 };
      await route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(body) });
    });
    await page.goto(BASE + '/#/jobs?failure_contains=needle');
    await page.locator('#searched').waitFor();
    const note = await page.locator('#searched').textContent();
    check(note.includes('50,000') && note.includes('4242'), `the note says how far: ${note}`);
    check((await page.locator('#next-page').textContent()).includes('Search on'), 'the link searches on');
    const shown = await page.locator('#main').textContent();
    check(!shown.includes('null'), `an empty page shows no stray "null": ${shown}`);
    await page.screenshot({ path: join(SHOTS, 'dashboard-searched.png'), fullPage: true });
    await page.click('#next-page');
    await page.waitForFunction(() => location.hash.includes('after=4242'));
    // The last page: no note once it has replaced the first.
    await page.waitForFunction(() => document.querySelector('#no-jobs') && !document.querySelector('#searched')
      && document.querySelector('#next-page') === null);
    check(await page.locator('#searched').count() === 0, 'the last page says nothing of a stopped search');
    await page.unroute('**/api/jobs?*');
  });

  await run('a kind is paused from the overview, says since when and by whom, and is resumed; a read token cannot', async () => {
    const post = (path, token) => page.evaluate(async ([path, token]) =>
      (await fetch(path, { method: 'POST', headers: { Authorization: 'Bearer ' + token } })).status, [path, token]);
    check(await post('/api/kinds/nightly_report/pause', READ_TOKEN) === 403, 'a read token cannot pause');
    const refused = await page.evaluate(async ([path, token]) => {
      const response = await fetch(path, { method: 'DELETE', headers: { Authorization: 'Bearer ' + token } });
      return [response.status, (await response.json()).error.message];
    }, ['/api/jobs/' + encodeURIComponent(HOSTILE_ID), OPERATE_TOKEN]);
    check(refused[0] === 403 && /\(on-call\) has the operate role; this needs an admin token/.test(refused[1]),
      `an operate token cannot delete, and is told why: ${refused}`);
    await page.goto(BASE + '/#/');
    const row = page.locator('#kinds tr[data-kind="nightly_report"]');
    await row.waitFor();
    check((await row.locator('button[data-pause]').textContent()) === 'Pause', 'a running kind offers a pause');
    await row.locator('button[data-pause]').click();
    await row.locator('.pause-state .paused').waitFor();
    const state = await row.locator('.pause-state').textContent();
    check(state.includes('QUEUE_ADMIN_TOKENS entry 1'), `it says which token paused it: ${state}`);
    check((await row.locator('button[data-pause]').textContent()) === 'Resume', 'a paused kind offers a resume');
    const pauses = await page.evaluate(async (token) =>
      (await fetch('/api/pauses', { headers: { Authorization: 'Bearer ' + token } })).json(), READ_TOKEN);
    check(pauses.length === 1 && pauses[0].kind === 'nightly_report', `the API lists the pause: ${JSON.stringify(pauses)}`);
    await page.screenshot({ path: join(SHOTS, 'dashboard-kind-paused.png'), fullPage: true });
    await row.locator('button[data-pause]').click();
    await page.waitForFunction(() => document.querySelector('#kinds tr[data-kind="nightly_report"] .pause-state .paused') === null);
    check((await row.locator('button[data-pause]').textContent()) === 'Pause', 'resumed, it offers a pause again');
  });

  await run('a page navigated to is never painted over by the overview\'s late answer or its timer', async () => {
    // The overview's figures take 1.5 s to come; the person goes to a job
    // page before they do.
    const slow = async (route) => {
      await new Promise((resolve) => setTimeout(resolve, 1500));
      await route.continue().catch(() => {});
    };
    await page.route('**/api/stats', slow);
    // A fresh load of the overview (a query string, so not a same-page
    // hash change), whose figures are then on their way.
    await page.goto(BASE + '/?reload#/');
    await page.locator('h1', { hasText: 'Overview' }).waitFor();
    await page.evaluate((id) => { location.hash = '#/jobs/' + encodeURIComponent(id); }, HOSTILE_ID);
    await page.locator('#payload').waitFor();
    for (const wait of [2000, 5500]) {
      // After the overview's answer came (2 s), and after its refresh
      // would have fired (5 s more).
      await page.waitForTimeout(wait);
      check(await page.locator('#payload').count() === 1, `the job page is still shown after ${wait} ms more`);
      check(await page.locator('[data-card=failed]').count() === 0, 'the overview did not paint over it');
    }
    await page.unroute('**/api/stats', slow);
  });

  await run('a waiting job is failed by hand with the reason asked for, and shows it', async () => {
    await page.goto(BASE + `/#/jobs/${HOSTILE_ID}`);
    await page.locator('#action-fail').waitFor();
    await page.click('#action-fail');
    await page.waitForFunction(() => document.querySelector('h1 [data-state]')?.dataset.state === 'failed');
    check((await page.locator('#failure').textContent()).includes(REASON), 'the reason is the failure message');
    check(await page.locator('#action-fail').count() === 0, 'a failed job offers no fail');
  });

  await run('the schedules page shows each schedule\'s next run and its last run\'s job', async () => {
    await page.goto(BASE + '/#/schedules');
    const beat = page.locator('#schedules tr[data-schedule="heartbeat"]');
    await beat.waitFor();
    // The 2 s schedule has run by now (or within the page's refresh).
    await page.waitForFunction(() => document.querySelector('#schedules tr[data-schedule="heartbeat"] .last-run a') !== null,
      null, { timeout: 15000 });
    const lastRun = await beat.locator('.last-run').textContent();
    check(/queued|processing|completed/.test(lastRun), `the last run's job and its state: ${lastRun}`);
    check((await beat.locator('td').nth(2).textContent()).includes('every'), 'the rule is shown');
    const nightly = page.locator('#schedules tr[data-schedule="nightly"]');
    check((await nightly.locator('td').nth(2).textContent()) === '0 3 * * *', 'the cron expression as given');
    check(/03:00:00/.test(await nightly.locator('.next-run').textContent()), 'the next nightly run is at 03:00');
    check(/not enqueued/.test(await nightly.locator('.last-run').textContent()),
      'a nightly run from before the server started was not enqueued, and it says so');
    await page.screenshot({ path: join(SHOTS, 'dashboard-schedules.png'), fullPage: true });
    await beat.locator('.last-run a').click();
    await page.locator('#payload').waitFor();
    check((await page.locator('h1').textContent()).includes('Job'), 'the last run links to its job');
  });

  await run('the workers page shows the live worker: host, pid, kinds, load and last beat', async () => {
    await page.goto(BASE + '/#/workers');
    const row = page.locator('#workers tr[data-worker="dashboard-beats"]');
    await row.waitFor();
    check((await row.locator('.kinds').textContent()) === 'heartbeat', 'the kinds its handler runs');
    check(/^\d+ \/ 2$/.test(await row.locator('.in-flight').textContent()), 'in flight out of its 2 handlers');
    const seen = Date.parse((await row.locator('.last-seen').textContent()).replace(' UTC', 'Z').replace(' ', 'T'));
    check(Math.abs(Date.now() - seen) < 30000, 'seen within the last seconds');
    await page.screenshot({ path: join(SHOTS, 'dashboard-workers.png'), fullPage: true });
  });

  await run('the audit page lists the writes made above, newest first, with who made them', async () => {
    await page.goto(BASE + '/#/audit');
    await page.locator('#audit tbody tr').first().waitFor();
    const rows = await page.locator('#audit tbody tr').allTextContents();
    const actions = rows.map((r) => ['fail', 'resume', 'pause', 'retry'].find((a) => r.includes(a)));
    check(JSON.stringify(actions.slice(0, 4)) === JSON.stringify(['fail', 'resume', 'pause', 'retry']),
      `the last four writes, newest first: ${rows.slice(0, 4).join(' | ')}`);
    check(rows.slice(0, 4).every((r) => r.includes('QUEUE_ADMIN_TOKENS entry 1')), 'each names the token that made it');
    check(rows[2].includes('nightly_report'), `the pause names its kind: ${rows[2]}`);
    check(await page.locator('#audit tbody tr.failed-entry').count() === 0, 'none of them failed');
    check(await page.locator('a[data-nav=audit].active').count() === 1, 'the nav shows where we are');
    check(!/null|undefined/.test(await page.locator('main').textContent()), 'nothing reads null or undefined');
    await page.screenshot({ path: join(SHOTS, 'dashboard-audit.png'), fullPage: true });
  });

  await run('a kind\'s limits are set from the Kinds table, listed by the API, refused to a read token, and cleared', async () => {
    await page.goto(BASE + '/#/');
    const cell = page.locator('#kinds tr[data-kind="send_email"] td.limits');
    await cell.waitFor();
    check((await cell.locator('summary').textContent()) === 'none', 'no limits at first');
    await cell.locator('summary').click();
    const form = cell.locator('form[data-limits="send_email"]');
    await form.locator('input[name=max_running]').fill('4');
    await form.locator('input[name=per_second]').fill('50');
    await form.locator('input[name=burst]').fill('5');
    await form.locator('button[type=submit]').click();
    await page.waitForFunction(() =>
      /4 at once, 50 a second \(bursts of 5\)/.test(document.querySelector('#kinds tr[data-kind="send_email"] td.limits summary')?.textContent || ''));
    await page.locator('#kinds tr[data-kind="send_email"] td.limits summary').click();
    await page.screenshot({ path: join(SHOTS, 'dashboard-kind-limits.png'), fullPage: true });
    const listed = await page.evaluate(async (token) =>
      (await fetch('/api/limits', { headers: { Authorization: 'Bearer ' + token } })).json(), READ_TOKEN);
    check(listed.length === 1 && listed[0].kind === 'send_email' && listed[0].max_running === 4
      && listed[0].per_second === 50 && listed[0].burst === 5 && listed[0].set_by === 'QUEUE_ADMIN_TOKENS entry 1',
    `the API lists the limits and who set them: ${JSON.stringify(listed)}`);
    const refused = await page.evaluate(async (token) => (await fetch('/api/kinds/send_email/limits', {
      method: 'PUT', headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json' }, body: '{}',
    })).status, READ_TOKEN);
    check(refused === 403, `a read token cannot change limits: ${refused}`);
    const again = page.locator('#kinds tr[data-kind="send_email"] td.limits form');
    // Half typed: the overview's 5 s refresh must not wipe it.
    await again.locator('input[name=max_running]').fill('7');
    await page.waitForTimeout(5500);
    check(await again.locator('input[name=max_running]').inputValue() === '7',
      'the refresh left the open limits form as typed');
    await again.locator('input[name=max_running]').fill('');
    await again.locator('input[name=per_second]').fill('');
    await again.locator('input[name=burst]').fill('');
    await again.locator('button[type=submit]').click();
    await page.waitForFunction(() =>
      document.querySelector('#kinds tr[data-kind="send_email"] td.limits summary')?.textContent === 'none');
  });

  // The figures the API gives for one kind in one state (read fresh).
  const countOf = async (kind, state) => {
    await page.waitForTimeout(1100);
    const stats = await page.evaluate(async (token) =>
      (await fetch('/api/stats', { headers: { Authorization: 'Bearer ' + token } })).json(), READ_TOKEN);
    return stats.counts.filter((c) => c.kind === kind && c.state === state).reduce((n, c) => n + c.count, 0);
  };

  await run(`"retry all matching" retries ${BULK_COUNT} jobs as an operation whose progress bar fills`, async () => {
    await page.goto(BASE + '/#/jobs?state=canceled&kind=bulk_import');
    await page.locator('#jobs tbody tr').first().waitFor();
    check(await page.locator('#jobs tbody tr').count() === 25, 'one page of the matching jobs is shown');
    await page.screenshot({ path: join(SHOTS, 'dashboard-bulk-select.png'), fullPage: true });
    await page.click('#bulk-retry');
    await page.waitForFunction(() => /^#\/operations\/\d+$/.test(location.hash));
    await page.locator('#op-progress').waitFor();
    check(/started over 10000 jobs/.test(await page.locator('#notice').textContent()), 'the notice says how many jobs it covers');
    await page.waitForFunction(() => document.querySelector('#op-state')?.textContent === 'done', null, { timeout: 60000 });
    const label = await page.locator('#op-progress .label').textContent();
    check(label === `${BULK_COUNT} / ${BULK_COUNT} (100%)`, `the bar is full: ${label}`);
    await page.screenshot({ path: join(SHOTS, 'dashboard-operation-done.png'), fullPage: true });
    check(await countOf('bulk_import', 'queued') === BULK_COUNT, 'every matching job is queued again');
    check(await countOf('bulk_import', 'canceled') === 0, 'none is left canceled');
  });

  await run('an operation is aborted part way from the operations page; the jobs it changed stay changed, no more', async () => {
    // Ten jobs a batch, so that it is still running when the abort comes.
    const started = await page.evaluate(async (token) => {
      const response = await fetch('/api/operations/cancel?kind=bulk_import&state=queued', {
        method: 'POST',
        headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json' },
        body: JSON.stringify({ batch: 10 }),
      });
      return [response.status, await response.json()];
    }, OPERATE_TOKEN);
    check(started[0] === 202 && started[1].total === BULK_COUNT && started[1].by === 'on-call',
      `an operate token starts a cancel of every queued one: ${JSON.stringify(started)}`);
    const id = started[1].id;
    await page.goto(BASE + '/#/operations');
    const row = page.locator(`#operations tr[data-operation="${id}"]`);
    await row.waitFor();
    await page.waitForFunction((id) => {
      const row = document.querySelector(`#operations tr[data-operation="${id}"]`);
      const done = Number(row?.querySelector('[role=progressbar]')?.getAttribute('aria-valuenow'));
      return row?.querySelector('.op-state')?.textContent === 'running' && done > 0;
    }, id, { timeout: 30000 });
    await page.screenshot({ path: join(SHOTS, 'dashboard-operations.png'), fullPage: true });
    await row.locator('button[data-abort]').click();
    await page.waitForFunction((id) =>
      document.querySelector(`#operations tr[data-operation="${id}"] .op-state`)?.textContent === 'aborted', id);
    check(await row.locator('button[data-abort]').count() === 0, 'an aborted operation offers no abort');
    const read = async () => page.evaluate(async ([id, token]) =>
      (await fetch('/api/operations/' + id, { headers: { Authorization: 'Bearer ' + token } })).json(), [id, READ_TOKEN]);
    const aborted = await read();
    check(aborted.message === 'aborted by QUEUE_ADMIN_TOKENS entry 1', `it says who aborted it: ${aborted.message}`);
    await page.waitForTimeout(1500);
    const later = await read();
    check(later.done < BULK_COUNT, `it stopped part way: ${later.done} of ${BULK_COUNT}`);
    check(later.done - aborted.done <= 10, `at most the batch under way ran after the abort: ${aborted.done}, then ${later.done}`);
    check(await countOf('bulk_import', 'canceled') === later.done, 'the jobs canceled are the ones it counted');
    check(await countOf('bulk_import', 'queued') === BULK_COUNT - later.done, 'the rest were left queued');
  });

  await run('a foreign table shows its own state values beside the standard ones', async () => {
    await page.goto(FOREIGN_BASE + '/');
    await page.locator('[data-card=failed] .stored').waitFor();
    check((await page.locator('[data-card=failed] .stored').textContent()).includes('broken'), 'the failed card says it is stored as broken');
    await page.goto(FOREIGN_BASE + '/#/jobs?state=broken');
    await page.locator('#jobs tbody tr').first().waitFor();
    const badges = await page.locator('#jobs tbody .stored-as').allTextContents();
    check(badges.length > 0 && badges.every((b) => b.includes('broken')), `each row shows the stored value: ${badges}`);
  });
} catch (error) {
  console.log('FAILED');
  await page.screenshot({ path: join(SHOTS, 'dashboard-failure.png'), fullPage: true }).catch(() => {});
  console.error(`dashboard: "${step}" failed: ${error.message}`);
  console.error(`dashboard: the page as it was: ${join(SHOTS, 'dashboard-failure.png')}`);
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
