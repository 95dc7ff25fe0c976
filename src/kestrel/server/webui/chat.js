// The chat page's controller: conversations, sending, streaming, stopping, keyboard.
// Per answer it measures, from the stream: TTFT (send to the first text, thinking or tool
// call) and the decode rate (tokens after the first over the time from the first to the end),
// and shows the server's usage (tokens, cached prompt tokens) and FlashHead from /props.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const state = { props: null, conv: null, controller: null };

  function apiKey() {
    return $('api-key').value.trim();
  }

  function note(text) {
    $('server-note').textContent = text;
    $('server-note').hidden = !text;
  }

  function setSettingsOpen(open) {
    $('settings').hidden = !open;
    $('settings-toggle').setAttribute('aria-expanded', String(open));
  }

  async function loadProps() {
    try {
      const props = await KestrelApi.getJson('/props', apiKey());
      state.props = props;
      $('model').textContent = props.model;
      const badges = [`ctx ${props.n_ctx.toLocaleString('en-US')}`, `FlashHead ${props.flashhead.enabled ? 'on' : 'off'}`];
      if (props.chat_format === 'gemma4') badges.push('Gemma 4');
      $('badges').textContent = badges.join(' · ');
      note(props.instruction_tuned ? '' : 'This model is a base model: its answers continue the text rather than follow instructions.');
    } catch (e) {
      state.props = null;
      $('model').textContent = 'not connected';
      if (e.status === 401) {
        note('This server needs an API key: enter it in Settings.');
        setSettingsOpen(true);
        $('api-key').focus();
      } else if (e.status === 503) {
        note('The server is loading the model…');
        setTimeout(loadProps, 1000);
      } else {
        note(`Cannot reach the server (${e.message}); retrying.`);
        setTimeout(loadProps, 3000);
      }
    }
  }

  // ---- conversations ----

  function renderList() {
    const list = KestrelStore.conversations();
    if (state.conv && !list.some((c) => c.id === state.conv.id)) list.unshift(state.conv);
    KestrelView.conversationList($('conversations'), list, state.conv && state.conv.id, openConversation, deleteConversation);
  }

  function renderMessages() {
    $('messages').replaceChildren(...state.conv.messages.map((m) => KestrelView.create(m)));
    $('empty').hidden = state.conv.messages.length > 0;
    scrollToEnd(true);
  }

  function openConversation(id) {
    if (state.controller) return;  // not while an answer streams
    state.conv = (id && KestrelStore.conversation(id)) || KestrelStore.createConversation();
    KestrelStore.setCurrentId(state.conv.id);
    renderList();
    renderMessages();
    $('message').focus();
  }

  function deleteConversation(id) {
    if (state.controller) return;
    KestrelStore.removeConversation(id);
    if (state.conv && state.conv.id === id) state.conv = null;
    const next = KestrelStore.conversations()[0];
    openConversation(state.conv ? state.conv.id : next && next.id);
  }

  function scrollToEnd(force) {
    const box = $('messages');
    const near = box.scrollHeight - box.scrollTop - box.clientHeight < 120;
    if (force || near) box.scrollTop = box.scrollHeight;
  }

  // The API messages for a conversation. A question whose answer failed with no text is left
  // out together with it, so that user and assistant turns keep alternating.
  function requestMessages(messages, system) {
    const out = [];
    if (system.trim()) out.push({ role: 'system', content: system });
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i];
      const next = messages[i + 1];
      if (m.role === 'user' && next && next.error && !next.content) {
        i++;
        continue;
      }
      out.push({ role: m.role, content: m.content || '' });
    }
    return out;
  }

  // ---- sending and stopping ----

  function setBusy(busy) {
    $('send').disabled = busy;
    $('stop').disabled = !busy;
    $('messages').setAttribute('aria-busy', String(busy));
  }

  async function send() {
    if (state.controller) return;
    const text = $('message').value;
    if (!text.trim()) return;
    const settings = KestrelSettings.read();
    let fields;
    try {
      fields = KestrelSettings.requestFields(settings);
      $('settings-error').textContent = '';
    } catch (e) {
      $('settings-error').textContent = e.message;
      setSettingsOpen(true);
      return;
    }
    KestrelStore.saveSettings(settings);
    const conv = state.conv;
    conv.messages.push({ role: 'user', content: text });
    if (conv.title === 'New chat') conv.title = text.trim().replace(/\s+/g, ' ').slice(0, 60);
    const body = {
      messages: requestMessages(conv.messages, settings.system),
      stream: true,
      stream_options: { include_usage: true },
      ...fields,
    };
    const answer = { role: 'assistant', content: '', reasoning: '', toolCalls: [], stats: {}, pending: true };
    conv.messages.push(answer);
    KestrelStore.saveConversation(conv);
    renderList();
    $('message').value = '';
    $('empty').hidden = true;
    $('messages').append(KestrelView.create(conv.messages[conv.messages.length - 2]));
    const article = KestrelView.create(answer);
    $('messages').append(article);
    scrollToEnd(true);

    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    const t0 = performance.now();
    let tFirst;
    let tEnd;
    let drawn = false;
    const redraw = () => {
      if (drawn) return;
      drawn = true;
      requestAnimationFrame(() => {
        drawn = false;
        KestrelView.update(article, answer);
        scrollToEnd(false);
      });
    };
    try {
      await KestrelApi.streamChat(body, apiKey(), controller.signal, (chunk, now) => {
        const choice = chunk.choices && chunk.choices[0];
        if (choice) {
          const d = choice.delta || {};
          if (tFirst === undefined && (d.content || d.reasoning_content || d.tool_calls)) {
            tFirst = now;
            answer.stats.ttftMs = now - t0;
          }
          if (d.content) answer.content += d.content;
          if (d.reasoning_content) answer.reasoning += d.reasoning_content;
          for (const call of d.tool_calls || []) {
            answer.toolCalls.push({ name: call.function.name, arguments: call.function.arguments });
          }
          if (choice.finish_reason) {
            answer.stats.finish = choice.finish_reason;
            tEnd = now;
          }
        }
        if (chunk.usage) {
          answer.stats.completionTokens = chunk.usage.completion_tokens;
          const details = chunk.usage.prompt_tokens_details;
          answer.stats.cachedTokens = details ? details.cached_tokens : 0;
        }
        // Speculative decoding's counters: OpenAI's predicted-output fields of the usage.
        const completion = chunk.usage && chunk.usage.completion_tokens_details;
        if (completion && completion.accepted_prediction_tokens !== undefined) {
          answer.stats.accepted = completion.accepted_prediction_tokens;
          answer.stats.drafted = completion.accepted_prediction_tokens + completion.rejected_prediction_tokens;
        }
        redraw();
      });
    } catch (e) {
      if (e.name === 'AbortError') {
        answer.stopped = true;
      } else {
        answer.error = e.message;
        if (e.status === 401) loadProps();
      }
    }
    const n = answer.stats.completionTokens;
    if (n > 1 && tEnd > tFirst) answer.stats.tokS = ((n - 1) * 1000) / (tEnd - tFirst);
    if (state.props) answer.stats.flashhead = state.props.flashhead.enabled;
    delete answer.pending;
    state.controller = null;
    KestrelView.update(article, answer);
    KestrelStore.saveConversation(conv);
    setBusy(false);
    $('message').focus();
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  // ---- wiring ----

  function init() {
    KestrelSettings.fill(KestrelStore.settings(), KestrelStore.apiKey());
    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      send();
    });
    $('message').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    document.addEventListener('keydown', (e) => {
      if (e.key !== 'Escape') return;
      if (state.controller) {
        e.preventDefault();
        stop();
      } else if (!$('settings').hidden) {
        e.preventDefault();
        setSettingsOpen(false);
        $('settings-toggle').focus();
      }
    });
    $('stop').addEventListener('click', stop);
    $('new-chat').addEventListener('click', () => openConversation(null));
    $('settings-toggle').addEventListener('click', () => setSettingsOpen($('settings').hidden));
    $('settings-close').addEventListener('click', () => {
      setSettingsOpen(false);
      $('settings-toggle').focus();
    });
    $('settings').addEventListener('change', (e) => {
      if (e.target.id === 'api-key') {
        KestrelStore.saveApiKey(apiKey());
        loadProps();
      } else {
        KestrelStore.saveSettings(KestrelSettings.read());
      }
    });
    setBusy(false);
    loadProps();
    openConversation(KestrelStore.currentId());
  }

  init();
})();
