// The live metrics page: polls /metrics (Prometheus text) every second and shows rates,
// load, prompt-cache hits and memory, with a chart of generated tokens per second.
'use strict';

(() => {
  const HISTORY = 120;  // seconds in the chart
  const $ = (id) => document.getElementById(id);
  let previous = null;
  const rates = [];

  /** Prometheus text to {name: [{labels, value}]}. */
  function parse(text) {
    const out = {};
    for (const line of text.split('\n')) {
      const m = /^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      for (const pair of (m[2] || '').matchAll(/(\w+)="([^"]*)"/g)) labels[pair[1]] = pair[2];
      (out[m[1]] = out[m[1]] || []).push({ labels, value: Number(m[3]) });
    }
    return out;
  }

  const one = (metrics, name, labels = {}) => {
    const series = (metrics[name] || []).find((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v));
    return series ? series.value : 0;
  };

  const fmt = (x, digits = 0) => x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
  const mib = (bytes) => `${fmt(bytes / 1048576, 0)} <small>MiB</small>`;
  const ms = (seconds) => `${fmt(seconds * 1000, 0)} <small>ms</small>`;

  function show(id, html) {
    $(id).innerHTML = html;
  }

  function draw() {
    const peak = Math.max(1, ...rates);
    const points = rates.map((r, i) => `${HISTORY - rates.length + i},${100 - (r / peak) * 95}`);
    $('chart-line').setAttribute('points', points.join(' '));
    $('chart-peak').textContent = `peak ${fmt(Math.max(0, ...rates), 1)} tok/s`;
  }

  function update(metrics, now) {
    // Tokens as they are generated: the TTFT and inter-token histograms count one observation
    // per token at once, while kestrel_generation_tokens_total grows when a request ends.
    const gen = one(metrics, 'kestrel_time_to_first_token_seconds_count') +
                one(metrics, 'kestrel_inter_token_latency_seconds_count');
    if (previous) {
      const genRate = Math.max(0, gen - previous.gen) / ((now - previous.now) / 1000);
      show('m-gen-rate', `${fmt(genRate, 1)} <small>tok/s</small>`);
      rates.push(genRate);
      if (rates.length > HISTORY) rates.shift();
      draw();
    }
    previous = { now, gen };
    show('m-prefilled', fmt(one(metrics, 'kestrel_prompt_tokens_total') - one(metrics, 'kestrel_prompt_tokens_cached_total')));
    show('m-running', `${fmt(one(metrics, 'kestrel_requests_running'))} / ${fmt(one(metrics, 'kestrel_sessions'))}`);
    show('m-queue', fmt(one(metrics, 'kestrel_queue_depth')));
    const hits = one(metrics, 'kestrel_prompt_cache_requests_total', { result: 'hit' });
    const misses = one(metrics, 'kestrel_prompt_cache_requests_total', { result: 'miss' });
    show('m-cache', hits + misses ? `${fmt((100 * hits) / (hits + misses), 0)} % <small>of ${fmt(hits + misses)}</small>` : '–');
    show('m-cached', fmt(one(metrics, 'kestrel_prompt_tokens_cached_total')));
    show('m-rss', mib(one(metrics, 'process_resident_memory_bytes')));
    show('m-kv', mib(one(metrics, 'kestrel_kv_cache_bytes')));
    const mean = (name) => {
      const n = one(metrics, `${name}_count`);
      return n ? ms(one(metrics, `${name}_sum`) / n) : '–';
    };
    show('m-ttft', mean('kestrel_time_to_first_token_seconds'));
    show('m-itl', mean('kestrel_inter_token_latency_seconds'));
    let total = 0;
    let errors = 0;
    for (const s of metrics.kestrel_requests_total || []) {
      total += s.value;
      if (Number(s.labels.status) >= 400) errors += s.value;
    }
    show('m-requests', `${fmt(total)} <small>(${fmt(errors)})</small>`);
    show('m-cancelled', fmt(one(metrics, 'kestrel_requests_cancelled_total')));
  }

  async function poll() {
    try {
      const res = await fetch('/metrics', { cache: 'no-store' });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      update(parse(await res.text()), performance.now());
      $('live-status').hidden = true;
    } catch (e) {
      $('live-status').textContent = `Cannot read /metrics (${e.message}); retrying.`;
      $('live-status').hidden = false;
    }
    setTimeout(poll, 1000);
  }

  poll();
})();
