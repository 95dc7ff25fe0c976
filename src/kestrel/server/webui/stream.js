// Talking to the server: JSON GETs and streamed chat completions (Server-Sent Events read
// from fetch, so that an AbortController can cancel them: closing the connection cancels the
// generation on the server).
'use strict';

const KestrelApi = (() => {
  class ApiError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  function headers(apiKey) {
    const h = { 'Content-Type': 'application/json' };
    if (apiKey) h.Authorization = `Bearer ${apiKey}`;
    return h;
  }

  async function failure(res) {
    let message = `HTTP ${res.status}`;
    try {
      const body = await res.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch {
      // not JSON: keep the status line
    }
    return new ApiError(message, res.status);
  }

  async function getJson(path, apiKey) {
    const res = await fetch(path, { headers: headers(apiKey) });
    if (!res.ok) throw await failure(res);
    return res.json();
  }

  /**
   * POSTs a streaming chat request and calls onChunk(chunk, now) for every chat.completion.chunk
   * (now: performance.now() when it arrived). Resolves at `data: [DONE]` or the end of the body;
   * rejects with ApiError for an error status or an error event, with an AbortError when
   * `signal` aborts.
   */
  async function streamChat(body, apiKey, signal, onChunk) {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: headers(apiKey),
      body: JSON.stringify(body),
      signal,
    });
    if (!res.ok) throw await failure(res);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data:')) continue;  // ':' lines are the server's heartbeats
          const data = line.slice(5).trim();
          if (data === '[DONE]') return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new ApiError(chunk.error.message || 'generation failed', 500);
          onChunk(chunk, performance.now());
        }
      }
    }
  }

  return { ApiError, getJson, streamChat };
})();
