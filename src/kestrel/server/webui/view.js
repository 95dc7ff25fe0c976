// Drawing messages and the conversation list. A message is
//   { role: 'user' | 'assistant', content, reasoning, toolCalls: [{name, arguments}],
//     stats: {ttftMs, tokS, completionTokens, cachedTokens, flashhead, drafted, accepted, finish},
//     error, stopped }
// Answers are rendered as Markdown (markdown.js, escaped); the user's text as plain text.
'use strict';

const KestrelView = (() => {
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function number(x, digits) {
    return x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
  }

  /** One line of per-answer figures, e.g. "TTFT 84 ms · 41.2 tok/s · 64 tokens · 12 cached · FlashHead off". */
  function statsText(msg) {
    const s = msg.stats || {};
    const parts = [];
    if (s.ttftMs !== undefined) parts.push(`TTFT ${number(s.ttftMs, 0)} ms`);
    if (s.tokS !== undefined) parts.push(`${number(s.tokS, 1)} tok/s`);
    if (s.completionTokens !== undefined) parts.push(`${s.completionTokens} token${s.completionTokens === 1 ? '' : 's'}`);
    if (s.cachedTokens !== undefined) parts.push(`${s.cachedTokens} cached`);
    if (s.flashhead !== undefined && s.flashhead !== null) parts.push(`FlashHead ${s.flashhead ? 'on' : 'off'}`);
    if (s.drafted) parts.push(`${s.drafted} drafted / ${s.accepted} accepted`);  // none without drafting
    if (msg.stopped) parts.push('stopped');
    else if (s.finish === 'length') parts.push('cut at max tokens');
    return parts.join(' · ');
  }

  function toolCallElement(call) {
    const box = el('div', 'tool-call');
    box.append(el('span', 'tool-label', 'Tool call'), el('code', 'tool-name', call.name));
    let args = call.arguments;
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      // shown as sent
    }
    box.append(el('pre', 'tool-args', args));
    return box;
  }

  /** Creates the element of a message; update() fills it. */
  function create(msg) {
    const article = el('article', `msg ${msg.role}`);
    article.setAttribute('aria-label', msg.role === 'user' ? 'Your message' : 'Answer');
    article.append(el('div', 'who', msg.role === 'user' ? 'You' : 'Kestrel'));
    update(article, msg);
    return article;
  }

  function update(article, msg) {
    const who = article.firstChild;
    article.replaceChildren(who);
    if (msg.role === 'user') {
      article.append(el('div', 'content plain', msg.content));
      return;
    }
    if (msg.reasoning) {
      const details = el('details', 'thinking');
      details.open = !msg.content;  // open while thinking, folded once the answer starts
      details.append(el('summary', '', 'Thinking'), el('div', 'thinking-text', msg.reasoning));
      article.append(details);
    }
    const content = el('div', 'content markdown');
    content.innerHTML = KestrelMarkdown.render(msg.content || '');
    article.append(content);
    for (const call of msg.toolCalls || []) article.append(toolCallElement(call));
    if (msg.error) {
      const error = el('p', 'error', msg.error);
      error.setAttribute('role', 'alert');
      article.append(error);
    }
    const stats = statsText(msg);
    if (stats) article.append(el('p', 'stats', stats));
    if (msg.pending) article.classList.add('pending');
    else article.classList.remove('pending');
  }

  /** The conversation list: a button per conversation to open it and one to delete it. */
  function conversationList(ul, list, currentId, onOpen, onDelete) {
    ul.replaceChildren();
    for (const conv of list) {
      const li = el('li', conv.id === currentId ? 'current' : '');
      const open = el('button', 'open', conv.title || 'New chat');
      open.type = 'button';
      if (conv.id === currentId) open.setAttribute('aria-current', 'true');
      open.addEventListener('click', () => onOpen(conv.id));
      const del = el('button', 'delete', '×');
      del.type = 'button';
      del.setAttribute('aria-label', `Delete conversation: ${conv.title || 'New chat'}`);
      del.title = 'Delete';
      del.addEventListener('click', () => onDelete(conv.id));
      li.append(open, del);
      ul.append(li);
    }
  }

  return { create, update, conversationList, statsText };
})();
