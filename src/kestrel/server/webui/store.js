// Conversations, settings and the API key, kept in the browser's localStorage (this origin
// only). Nothing is sent anywhere but to this server's API.
'use strict';

const KestrelStore = (() => {
  const CONVERSATIONS = 'kestrel.conversations.v1';
  const CURRENT = 'kestrel.current.v1';
  const SETTINGS = 'kestrel.settings.v1';
  const API_KEY = 'kestrel.apiKey.v1';

  function read(key, fallback) {
    try {
      const text = localStorage.getItem(key);
      return text === null ? fallback : JSON.parse(text);
    } catch {
      return fallback;  // storage disabled, or a value this version cannot read
    }
  }

  function write(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
      return true;
    } catch {
      return false;  // quota exceeded or storage disabled
    }
  }

  function newId() {
    return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
  }

  /** Every conversation, the most recently updated first. */
  function conversations() {
    const list = read(CONVERSATIONS, []);
    return Array.isArray(list) ? list.sort((a, b) => b.updated - a.updated) : [];
  }

  function conversation(id) {
    return conversations().find((c) => c.id === id) || null;
  }

  /** Saves one conversation; when storage is full, the oldest others are dropped first. */
  function saveConversation(conv) {
    conv.updated = Date.now();
    let list = conversations().filter((c) => c.id !== conv.id);
    list.unshift(conv);
    while (!write(CONVERSATIONS, list) && list.length > 1) list.pop();
  }

  function removeConversation(id) {
    write(CONVERSATIONS, conversations().filter((c) => c.id !== id));
  }

  function createConversation() {
    return { id: newId(), title: 'New chat', updated: Date.now(), messages: [] };
  }

  return {
    conversations,
    conversation,
    saveConversation,
    removeConversation,
    createConversation,
    currentId: () => read(CURRENT, null),
    setCurrentId: (id) => write(CURRENT, id),
    settings: () => read(SETTINGS, {}),
    saveSettings: (s) => write(SETTINGS, s),
    apiKey: () => read(API_KEY, ''),
    saveApiKey: (key) => write(API_KEY, key),
  };
})();
