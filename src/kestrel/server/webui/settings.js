// The settings panel: system prompt, sampling, thinking, API key and extra request fields,
// read from and written to the form, and turned into chat request fields.
'use strict';

const KestrelSettings = (() => {
  // Empty number fields are left out of the request (the server's defaults apply).
  const NUMBERS = [
    ['temperature', 'temperature', 0.8],
    ['top-p', 'top_p', 0.95],
    ['top-k', 'top_k', 40],
    ['min-p', 'min_p', 0.05],
    ['max-tokens', 'max_tokens', 512],
    ['seed', 'seed', ''],
  ];

  const field = (id) => document.getElementById(id);

  /** Fills the form from saved settings (defaults where a value is missing). */
  function fill(saved, apiKey) {
    for (const [id, key, fallback] of NUMBERS) field(id).value = key in saved ? saved[key] : fallback;
    field('system').value = saved.system || '';
    field('thinking').checked = Boolean(saved.thinking);
    field('extra').value = saved.extra || '';
    field('api-key').value = apiKey || '';
  }

  /** The form's values, as saved. */
  function read() {
    const s = { system: field('system').value, thinking: field('thinking').checked, extra: field('extra').value };
    for (const [id, key] of NUMBERS) s[key] = field(id).value;
    return s;
  }

  /** Request fields for saved settings; throws Error with a readable message for bad input. */
  function requestFields(s) {
    const out = {};
    for (const [, key] of NUMBERS) {
      const text = String(s[key] ?? '').trim();
      if (!text) continue;
      const value = Number(text);
      if (!Number.isFinite(value)) throw new Error(`${key} must be a number`);
      out[key] = value;
    }
    if (s.thinking) out.chat_template_kwargs = { enable_thinking: true };
    const extra = String(s.extra || '').trim();
    if (extra) {
      let fields;
      try {
        fields = JSON.parse(extra);
      } catch (e) {
        throw new Error(`extra request fields: not JSON (${e.message})`);
      }
      if (!fields || typeof fields !== 'object' || Array.isArray(fields)) {
        throw new Error('extra request fields must be a JSON object');
      }
      // The page streams the conversation it shows: these stay its own.
      for (const key of ['stream', 'stream_options', 'messages', 'model']) {
        if (key in fields) throw new Error(`extra request fields: "${key}" is set by the page`);
      }
      Object.assign(out, fields);
    }
    return out;
  }

  return { fill, read, requestFields };
})();
