// A small Markdown renderer for model answers. Safe by construction: every piece of text is
// HTML-escaped before any tag is added, links keep only http(s) and mailto addresses, and no
// attribute but href, class and rel is ever written. Supports fenced code, inline code,
// headings, bold, italic, strikethrough, links, lists, block quotes, rules and tables; an
// unterminated code fence (an answer still streaming) renders as code up to the end.
'use strict';

const KestrelMarkdown = (() => {
  const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  }

  function safeUrl(url) {
    return /^(https?:\/\/|mailto:)/i.test(url) ? url : null;
  }

  // Inline spans of one block. Code spans and links become placeholders first, so that the
  // emphasis rules never reach into code or into an address.
  function inline(text) {
    const held = [];
    const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
    let s = String(text).replace(/\u0000/g, '');
    s = s.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, ticks, code) =>
      hold(`<code>${escapeHtml(code.trim())}</code>`));
    s = s.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (whole, label, url) => {
      const href = safeUrl(url);
      if (!href) return whole;
      return hold(`<a href="${escapeHtml(href)}" rel="noopener noreferrer" target="_blank">${emphasis(escapeHtml(label))}</a>`);
    });
    s = emphasis(escapeHtml(s));
    return s.replace(/\u0000(\d+)\u0000/g, (_, i) => held[Number(i)]);
  }

  function emphasis(s) {
    return s
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, '<strong>$1</strong>')
      .replace(/__(?=\S)([\s\S]*?\S)__(?!\w)/g, '<strong>$1</strong>')
      .replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>')
      .replace(/(^|[^*\w])\*(?=\S)([^*\n]*?\S)\*(?![*\w])/g, '$1<em>$2</em>')
      .replace(/(^|[^_\w])_(?=\S)([^_\n]*?\S)_(?![_\w])/g, '$1<em>$2</em>');
  }

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_SEPARATOR = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
  }

  function cells(line) {
    return line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
  }

  function render(source) {
    const lines = String(source).replace(/\r\n?/g, '\n').split('\n');
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const code = [];
        for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) code.push(lines[i]);
        i++;
        const cls = m[2] ? ` class="language-${escapeHtml(m[2])}"` : '';
        out.push(`<pre><code${cls}>${escapeHtml(code.join('\n'))}</code></pre>`);
      } else if (!line.trim()) {
        i++;
      } else if ((m = HEADING.exec(line))) {
        // Answer headings sit below the page's own: # becomes h3.
        const level = Math.min(6, m[1].length + 2);
        out.push(`<h${level}>${inline(m[2])}</h${level}>`);
        i++;
      } else if (RULE.test(line)) {
        out.push('<hr>');
        i++;
      } else if (QUOTE.test(line)) {
        const quoted = [];
        for (; i < lines.length && QUOTE.test(lines[i]); i++) quoted.push(lines[i].replace(QUOTE, ''));
        out.push(`<blockquote>${render(quoted.join('\n'))}</blockquote>`);
      } else if (ITEM.test(line)) {
        const ordered = /\d/.test(ITEM.exec(line)[2]);
        const items = [];
        for (; i < lines.length; i++) {
          const item = ITEM.exec(lines[i]);
          if (item && /\d/.test(item[2]) === ordered) {
            items.push(item[3]);
          } else if (item || !lines[i].trim() || !/^\s/.test(lines[i]) || !items.length) {
            break;
          } else {
            items[items.length - 1] += '\n' + lines[i].trim();  // an indented continuation line
          }
        }
        const tag = ordered ? 'ol' : 'ul';
        out.push(`<${tag}>${items.map((t) => `<li>${inline(t).replace(/\n/g, '<br>')}</li>`).join('')}</${tag}>`);
      } else if (line.includes('|') && i + 1 < lines.length && TABLE_SEPARATOR.test(lines[i + 1]) && lines[i + 1].includes('-')) {
        const head = cells(line);
        const rows = [];
        for (i += 2; i < lines.length && lines[i].includes('|') && lines[i].trim(); i++) rows.push(cells(lines[i]));
        const th = head.map((c) => `<th>${inline(c)}</th>`).join('');
        const body = rows.map((r) => `<tr>${r.map((c) => `<td>${inline(c)}</td>`).join('')}</tr>`).join('');
        out.push(`<table><thead><tr>${th}</tr></thead><tbody>${body}</tbody></table>`);
      } else {
        const para = [];
        for (; i < lines.length && lines[i].trim() && (!para.length || !startsBlock(lines[i])); i++) para.push(lines[i]);
        out.push(`<p>${inline(para.join('\n')).replace(/\n/g, '<br>')}</p>`);
      }
    }
    return out.join('\n');
  }

  return { render, escapeHtml };
})();
