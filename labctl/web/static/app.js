// labctl serve: the pages' behaviour. Every text that comes from a lab, a guest or a handout
// goes into the page as a text node (textContent / append(string)), never as markup.
'use strict';

const body = document.body;
const main = document.getElementById('main');
const live = document.getElementById('live');

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : String(kid));
  }
  return e;
}

async function post(url, data) {
  const r = await fetch(url, {
    method: 'POST', credentials: 'same-origin',
    headers: {'content-type': 'application/json'}, body: JSON.stringify(data || {}),
  });
  let json = {};
  try { json = await r.json(); } catch (e) { /* no body */ }
  if (!r.ok) throw new Error(json.error || ('HTTP ' + r.status));
  return json;
}

function ago(epoch) {
  if (!epoch) return 'never';
  const s = Math.max(0, Math.round(Date.now() / 1000 - epoch));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  return Math.round(s / 3600) + ' h ago';
}

function setLive(text, cls) {
  live.textContent = text;
  live.className = 'live ' + (cls || '');
}

function subscribe(query, onView) {
  const es = new EventSource('/api/events?' + query);
  es.onopen = () => setLive('live', 'ok');
  es.onmessage = (ev) => { setLive('live', 'ok'); onView(JSON.parse(ev.data)); };
  es.onerror = () => setLive('reconnecting…', 'bad');
  es.addEventListener('revoked', () => { es.close(); setLive('access revoked', 'bad'); revoked(); });
  return es;
}

const terminals = [];
function revoked() {
  for (const t of terminals) t.stop('access revoked');
  document.querySelectorAll('button').forEach((b) => { b.disabled = true; });
}

// A terminal: xterm.js on a websocket to the server, which bridges it to an SSH channel.
function openTerminal(box, ident, guest, mode) {
  const status = el('div', {class: 'term-status'}, 'connecting…');
  const screen = el('div', {class: 'term-screen'});
  box.replaceChildren(status, screen);
  const term = new Terminal({cursorBlink: true, fontSize: 14, scrollback: 5000,
                             disableStdin: mode !== 'rw', fontFamily: 'monospace'});
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  try { fit.fit(); } catch (e) { /* hidden */ }
  let ws = null;
  let delay = 500;
  let stopped = false;
  const enc = new TextEncoder();
  const say = (text, cls) => { status.textContent = text; status.className = 'term-status ' + (cls || ''); };

  function connect() {
    if (stopped) return;
    const proto = location.protocol === 'https:' ? 'wss' : 'ws';
    const url = `${proto}://${location.host}/ws/term/${encodeURIComponent(ident)}/${encodeURIComponent(guest)}` +
                `?mode=${mode}&cols=${term.cols}&rows=${term.rows}`;
    let opened = false;
    ws = new WebSocket(url);
    ws.binaryType = 'arraybuffer';
    // "connected" once the server says the shell is open (its first text frame), not when the
    // socket opens: a guest being reset is logged into only after the reset has ended.
    ws.onopen = () => { opened = true; say(`${guest}: logging in…`, ''); };
    ws.onmessage = (ev) => {
      if (typeof ev.data === 'string') {
        const m = JSON.parse(ev.data);
        if (m.error) say(`${guest}: ${m.error}`, 'bad');
        if (m.mode) {
          delay = 500;
          term.reset();
          say(`${guest}: connected (${m.mode === 'rw' ? 'read-write' : 'read-only'})`, 'ok');
        }
        return;
      }
      term.write(new Uint8Array(ev.data));
    };
    ws.onclose = async (ev) => {
      if (stopped) return;
      if (ev.code === 4403) { stop('access revoked'); return; }
      if (!opened) {  // refused at the handshake: is it access?
        try {
          const r = await fetch('/api/lab/' + encodeURIComponent(ident), {credentials: 'same-origin'});
          if (r.status === 403) { stop('access revoked'); return; }
        } catch (e) { /* server away: retry */ }
      }
      say(`${guest}: ${ev.reason || 'disconnected'}; reconnecting…`, 'bad');
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 8000);
    };
  }
  function stop(why) {
    stopped = true;
    say(`${guest}: ${why}`, 'bad');
    term.options.disableStdin = true;
    if (ws) ws.close();
  }
  term.onData((d) => { if (mode === 'rw' && ws && ws.readyState === 1) ws.send(enc.encode(d)); });
  term.onResize(({cols, rows}) => { if (ws && ws.readyState === 1) ws.send(JSON.stringify({resize: [cols, rows]})); });
  new ResizeObserver(() => { try { fit.fit(); } catch (e) { /* hidden */ } }).observe(screen);
  connect();
  const handle = {term, stop, ident, guest};
  terminals.push(handle);
  return handle;
}

function stateBadge(g) {
  return el('span', {class: 'state state-' + g.state, 'data-state': g.state}, g.state);
}

function checksList(view, onCheck) {
  const c = view.checks;
  const list = el('ul', {class: 'checks'});
  for (const r of c.checks) {
    const st = r.status || 'not run';
    list.append(el('li', {class: 'check check-' + st.replace(' ', '-'), 'data-check': r.name, 'data-status': st},
      el('span', {class: 'mark'}, st === 'pass' ? '✔' : st === 'not run' ? '·' : '✘'), ' ',
      el('b', {}, r.name), ` on ${r.guest}: ${st}`,
      st !== 'pass' && r.hint ? el('div', {class: 'hint'}, r.hint) : null));
  }
  const btn = el('button', {class: 'check-now', onclick: onCheck, disabled: c.running}, c.running ? 'checking…' : 'check now');
  return el('div', {}, el('p', {class: 'summary'}, `${c.passed}/${c.total} checks pass`,
    c.ran_at ? ` (checked ${ago(c.ran_at)})` : ' (not checked yet)', ' ', btn), list,
    c.error ? el('p', {class: 'bad'}, c.error) : null);
}

// ---- the engineer's tools on their own lab page (owner only): console, captures, impairments, links
function impairText(values) {
  return Object.entries(values || {}).map(([k, v]) => `${k}=${v}`).join(' ');
}

function parseImpair(text) {  // "delay=20ms loss=1%" -> {delay: "20ms", loss: "1%"}; the server checks the values
  const out = {};
  for (const part of text.split(/[\s,]+/).filter(Boolean)) {
    const m = part.match(/^([a-z]+)[=:](.+)$/);
    if (!m) throw new Error(`say key=value, e.g. delay=20ms loss=1% (not “${part}”)`);
    out[m[1]] = m[1] === 'limit' && /^\d+$/.test(m[2]) ? Number(m[2]) : m[2];
  }
  return out;
}

function ownerTools(ident, holder) {
  const base = `/api/lab/${encodeURIComponent(ident)}`;
  const consoleSel = el('select', {id: 'console-guest'});
  const consoleText = el('pre', {id: 'console-text'});
  const consoleStatus = el('span', {class: 'dim', id: 'console-status'});
  const netTable = el('table', {id: 'nics'});
  const capList = el('ul', {id: 'captures'});
  const toolError = el('p', {class: 'bad', id: 'tool-error'});
  holder.append(
    el('section', {id: 'console'}, el('h2', {}, 'Console ', consoleSel, ' ', consoleStatus), consoleText),
    el('section', {id: 'network'}, el('h2', {}, 'Links, impairments, captures'), toolError, netTable,
      el('h2', {}, 'Saved captures (pcapng)'), capList));
  const say = (e) => { toolError.textContent = e ? e.message : ''; };
  const act = async (url, data) => { say(null); try { return await post(url, data); } catch (e) { say(e); return null; } };

  let consoleEs = null;
  const MAX_CONSOLE = 200000;
  function showConsole(guest) {
    if (consoleEs) consoleEs.close();
    consoleText.textContent = '';
    consoleEs = new EventSource(`${base}/console/${encodeURIComponent(guest)}`);
    consoleEs.onopen = () => { consoleStatus.textContent = 'live'; };
    consoleEs.onerror = () => { consoleStatus.textContent = 'reconnecting…'; };
    consoleEs.addEventListener('revoked', () => { consoleEs.close(); consoleStatus.textContent = 'access revoked'; });
    consoleEs.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.error) { consoleStatus.textContent = m.error; return; }
      const follow = consoleText.scrollTop + consoleText.clientHeight >= consoleText.scrollHeight - 4;
      if (m.restart) consoleText.textContent = '';
      consoleText.append(m.text);  // a text node: the guest's bytes never become markup
      if (consoleText.textContent.length > MAX_CONSOLE) consoleText.textContent = consoleText.textContent.slice(-MAX_CONSOLE);
      if (follow) consoleText.scrollTop = consoleText.scrollHeight;
    };
  }
  consoleSel.addEventListener('change', () => showConsole(consoleSel.value));

  const rows = {};
  function render(view) {
    const names = view.guests.map((g) => g.name);
    if (names.join(' ') !== [...consoleSel.options].map((o) => o.value).join(' ')) {
      const keep = consoleSel.value;
      consoleSel.replaceChildren(...names.map((n) => el('option', {value: n}, n)));
      if (names.includes(keep)) consoleSel.value = keep;
      if (names.length && (!consoleEs || keep !== consoleSel.value)) showConsole(consoleSel.value);
    }
    const tools = view.tools || {nics: [], captures: []};
    if (!netTable.firstChild) {
      netTable.append(el('thead', {}, el('tr', {}, ...['NIC', 'network', 'link', 'impairment', 'capture'].map((h) => el('th', {}, h)))),
        el('tbody'));
    }
    for (const n of tools.nics) {
      const key = `${n.guest}.${n.nic}`;
      let r = rows[key];
      const body = {guest: n.guest, nic: n.nic};
      if (!r) {
        r = rows[key] = {link: el('span', {class: 'link-state'}), linkBtn: el('button', {class: 'link-toggle'}),
          imp: el('span', {class: 'impair-now'}), input: el('input', {class: 'impair-input', size: 24,
            placeholder: 'delay=20ms loss=1% rate=10mbit'}),
          set: el('button', {class: 'impair-set'}, 'set'), clear: el('button', {class: 'impair-clear'}, 'clear'),
          cap: el('button', {class: 'capture-toggle'}), capNow: el('span', {class: 'capture-state dim'})};
        r.linkBtn.addEventListener('click', () => act(`${base}/link`, {...body, up: r.link.dataset.state === 'down'}));
        r.set.addEventListener('click', () => {
          let values;
          try { values = parseImpair(r.input.value); } catch (e) { say(e); return; }
          act(`${base}/impair`, {...body, impair: values});
        });
        r.clear.addEventListener('click', () => act(`${base}/impair`, {...body, impair: null}));
        r.cap.addEventListener('click', () => {
          const id = r.cap.dataset.capture;
          if (id) act(`${base}/captures/${encodeURIComponent(id)}/stop`);
          else act(`${base}/captures`, body);
        });
        netTable.lastChild.append(el('tr', {'data-nic': key},
          el('td', {}, el('b', {}, key)), el('td', {}, n.network, n.ip ? el('div', {class: 'dim'}, n.ip) : null),
          el('td', {}, r.link, ' ', r.linkBtn),
          el('td', {}, r.imp, el('div', {}, r.input, ' ', r.set, ' ', r.clear)),
          el('td', {}, r.cap, ' ', r.capNow)));
      }
      r.link.textContent = n.link;
      r.link.dataset.state = n.link;
      r.link.className = 'link-state ' + (n.link === 'up' ? 'good' : 'bad');
      r.linkBtn.textContent = n.link === 'up' ? 'take down' : 'bring up';
      r.imp.textContent = n.impair_text || 'none';
      r.imp.dataset.impair = impairText(n.impair);
      r.cap.textContent = n.capture ? 'stop capture' : 'start capture';
      r.cap.dataset.capture = n.capture || '';
      r.capNow.textContent = n.capture ? `capturing since ${ago(n.capture_started)}` : '';
    }
    capList.replaceChildren(...tools.captures.map((c) => el('li', {'data-capture': c.id},
      el('a', {href: `${base}/captures/${encodeURIComponent(c.id)}.pcapng`, download: ''}, `${c.label}.pcapng`),
      ` ${c.frames} frames, ${c.bytes} bytes, ${ago(c.stopped)}`,
      ...(c.warnings || []).map((w) => el('div', {class: 'bad'}, w)))));
  }
  return render;
}

// ---- the lab page (a student's, or the owner's) ----------------------------------------------
function labPage() {
  const ident = body.dataset.lab;
  const role = body.dataset.role;
  document.getElementById('who').textContent = body.dataset.who || '';
  const guestsBox = el('section', {id: 'guests'});
  const checksBox = el('section', {id: 'checks'}, el('h2', {}, 'Checks'));
  const checksInner = el('div');
  checksBox.append(checksInner);
  const topoSrc = '/api/lab/' + encodeURIComponent(ident) + '/topology.svg';
  const topoBox = el('div', {id: 'topology-picture'});
  const topo = el('section', {id: 'topology'}, el('h2', {}, 'Topology'), topoBox);
  let topoState = '';
  loadTopology(topoSrc, topoBox);
  let packets = null;
  const handout = el('section', {id: 'handout'}, el('h2', {}, 'Handout'), el('p', {id: 'handout-note', class: 'bad'}),
    el('pre', {id: 'handout-text'}));
  const left = el('div', {class: 'left'}, guestsBox);
  main.replaceChildren(el('div', {class: 'cols'}, left, el('div', {class: 'right'}, checksBox, topo, handout)));
  const renderTools = role === 'owner' ? ownerTools(ident, left) : null;
  const boxes = {};
  let checking = false;

  async function checkNow() {
    checking = true;
    render(last);
    try { const c = await post(`/api/lab/${encodeURIComponent(ident)}/checks`); last.checks = c; } catch (e) { alert(e.message); }
    checking = false;
    render(last);
  }
  let last = null;
  function render(view) {
    if (!view) return;
    last = view;
    if (view.handout !== undefined) document.getElementById('handout-text').textContent = view.handout;
    if (view.handout_note !== undefined) document.getElementById('handout-note').textContent = view.handout_note;
    if (!view.up) guestsBox.replaceChildren(el('p', {class: 'bad'}, `lab ${ident} is not up`));
    for (const g of view.guests) {
      let b = boxes[g.name];
      if (!b) {
        const head = el('div', {class: 'guest-head'});
        const termBox = el('div', {class: 'term', 'data-guest': g.name});
        b = boxes[g.name] = {head, termBox, box: el('div', {class: 'guest', 'data-guest': g.name}, head, termBox)};
        guestsBox.append(b.box);
        openTerminal(termBox, ident, g.name, 'rw');
      }
      const mayReset = role !== 'student' || view.allow_reset;
      const busy = (view.resetting || []).includes(g.name);
      b.head.replaceChildren(...[el('h2', {}, g.name), ' ', stateBadge(g),
        g.panic ? el('span', {class: 'panic'}, g.panic) : null,
        mayReset ? el('button', {class: 'reset', disabled: busy, onclick: async () => {
          if (!confirm(`reset ${g.name} to its post-boot state?`)) return;
          try { await post(`/api/lab/${encodeURIComponent(ident)}/reset/${encodeURIComponent(g.name)}`); } catch (e) { alert(e.message); }
        }}, busy ? 'resetting…' : 'reset') : null].filter((x) => x !== null));
    }
    const c = {...view, checks: {...view.checks, running: view.checks.running || checking}};
    checksInner.replaceChildren(checksList(c, checkNow));
    if (renderTools && view.up) renderTools(view);
    // the picture shows guests' states, links down, impairments and captures: redrawn when they change
    const now = JSON.stringify([view.guests.map((g) => g.state), view.tools ? view.tools.nics : null]);
    if (topoState && now !== topoState) loadTopology(topoSrc + '?v=' + Date.now(), topoBox);
    topoState = now;
    if (!packets && view.up && (role !== 'student' || view.allow_follow)) {
      packets = packetsPanel(ident, topoBox);
      topo.after(packets);
    }
  }
  fetch('/api/lab/' + encodeURIComponent(ident), {credentials: 'same-origin'})
    .then((r) => r.ok ? r.json() : Promise.reject(new Error('HTTP ' + r.status)))
    .then(render).catch((e) => setLive(e.message, 'bad'));
  subscribe('lab=' + encodeURIComponent(ident), (v) => { v.handout = v.handout_note = undefined; render(v); });
}

// ---- the topology, inline (so that a followed packet's hops can be lit on it) -----------------
// The picture is labctl's own SVG (names escaped, no scripts); parsed as XML, never as HTML.
async function loadTopology(src, box) {
  try {
    const r = await fetch(src, {credentials: 'same-origin'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    const doc = new DOMParser().parseFromString(await r.text(), 'image/svg+xml');
    const svg = doc.documentElement;
    if (svg.nodeName !== 'svg') throw new Error('not a picture');
    svg.removeAttribute('width');
    svg.removeAttribute('height');
    box.replaceChildren(document.importNode(svg, true));
    if (box.replay) box.replay();
  } catch (e) {
    box.replaceChildren(el('p', {class: 'bad'}, 'topology: ' + e.message));
  }
}

// ---- packets followed through the lab, each hop lit in turn on the topology ------------------
const HOP_MS = 450;
const esc = (s) => String(s).replace(/["\\]/g, '\\$&');

function hopTargets(svg, hop) {
  // a guest's hop: the guest and its NIC; a wire hop 'a.eth1 → r.eth1': both NICs' links and the network
  if (hop.point !== 'wire') {
    const found = [...svg.querySelectorAll(`g.guest[data-guest="${esc(hop.guest)}"]`)];
    if (hop.dev) found.push(...svg.querySelectorAll(`g.nic[data-guest="${esc(hop.guest)}"][data-nic="${esc(hop.dev)}"]`));
    return found;
  }
  const found = [];
  for (const end of hop.where.split(' → ')) {
    const [guest, nic] = end.split('.');
    for (const link of svg.querySelectorAll(`path.link[data-guest="${esc(guest)}"][data-nic="${esc(nic || '')}"]`)) {
      found.push(link, ...svg.querySelectorAll(`g.network[data-network="${esc(link.dataset.network)}"]`));
    }
  }
  return found;
}

function hopRow(hop) {
  // one hop as follow prints it: where (the guest's function and device, or the wire), then its note
  // (a NAT rewrite, the nft rule, the XDP verdict, the tunnel's outer header...), all as text
  const where = hop.point === 'wire' ? hop.where : `${hop.guest} ${hop.where}${hop.dev ? ' ' + hop.dev : ''}`;
  return el('li', {class: 'hop'}, el('span', {class: 'where'}, where),
    hop.note ? el('span', {class: 'note'}, '  ' + hop.note) : null);
}

function showHops(list, p) {
  list.dataset.packet = p.id;
  list.replaceChildren(...p.hops.map(hopRow));
  const end = p.end || {};
  if (end.text) list.append(el('li', {class: 'hop end ' + (end.kind || '')}, end.text));
}

function playPacket(box, p, list) {
  if (list) showHops(list, p);
  const svg = box.querySelector('svg');
  if (!svg) return;
  clearTimeout(box.timer);
  svg.querySelectorAll('.lit, .dropmark, .lostmark').forEach((e) => e.classList.remove('lit', 'dropmark', 'lostmark'));
  const played = [];
  svg.dataset.packet = p.id;
  svg.dataset.played = '';
  svg.dataset.end = '';
  const step = (i) => {
    svg.querySelectorAll('.lit').forEach((e) => e.classList.remove('lit'));
    if (i >= p.hops.length) {
      const end = p.end || {};
      if (end.kind === 'dropped') {
        svg.querySelectorAll(`g.guest[data-guest="${esc(end.guest)}"]`).forEach((e) => e.classList.add('dropmark'));
      } else if (end.kind === 'lost') {
        const nic = (end.text.match(/wire (\S+?)\.(\S+) →/) || []);
        svg.querySelectorAll(`path.link[data-guest="${esc(nic[1] || '')}"][data-nic="${esc(nic[2] || '')}"]`)
          .forEach((e) => e.classList.add('lostmark'));
      }
      svg.dataset.end = end.kind || '';
      return;
    }
    const hop = p.hops[i];
    hopTargets(svg, hop).forEach((e) => e.classList.add('lit'));
    if (list) [...list.children].forEach((row, k) => row.classList.toggle('now', k === i));
    played.push(hop.point === 'wire' ? hop.where : hop.guest);
    svg.dataset.played = played.filter((x, k) => k === 0 || played[k - 1] !== x).join(',');
    box.timer = setTimeout(() => step(i + 1), HOP_MS);
  };
  box.replay = () => playPacket(box, p, list);
  step(0);
}

function packetsPanel(ident, topoBox) {
  const base = '/api/lab/' + encodeURIComponent(ident);
  const filter = el('input', {type: 'text', id: 'follow-filter', value: 'icmp', size: 30, 'aria-label': 'filter (pcap syntax)'});
  const status = el('span', {id: 'follow-status', class: 'dim'});
  const start = el('button', {id: 'follow-start', onclick: () => post(base + '/follow', {filter: filter.value})
    .then(render).catch((e) => { status.textContent = e.message; })}, 'follow');
  const stop = el('button', {id: 'follow-stop', onclick: () => post(base + '/follow/stop').then(render)
    .catch((e) => { status.textContent = e.message; })}, 'stop');
  const list = el('ol', {id: 'packets', reversed: true});
  const hopList = el('ol', {id: 'hops'});
  let shown = '';
  function render(v) {
    // a follow being set up (probes going on, several seconds under TCG) does not see packets yet: say so
    status.textContent = !v.running ? (v.error || 'not following')
      : v.ready ? `following '${v.filter}' on every guest` : `starting to follow '${v.filter}': probes going on`;
    start.disabled = v.running;
    stop.disabled = !v.running;
    list.replaceChildren(...v.packets.slice().reverse().map((p) => el('li', {
      class: 'packet ' + ((p.end || {}).kind || ''), 'data-id': p.id, onclick: () => playPacket(topoBox, p, hopList),
    }, el('b', {}, p.packet), ': ', (p.end || {}).text || '')));
    const newest = v.packets[v.packets.length - 1];
    const key = newest ? `${newest.id}@${newest.at}` : '';
    if (newest && key !== shown) {
      shown = key;
      playPacket(topoBox, newest, hopList);
    }
  }
  const poll = () => fetch(base + '/packets', {credentials: 'same-origin'})
    .then((r) => r.ok ? r.json() : Promise.reject(new Error('HTTP ' + r.status))).then(render)
    .catch((e) => { status.textContent = e.message; });
  poll();
  setInterval(poll, 1000);
  return el('section', {id: 'follow'}, el('h2', {}, 'Packets'),
    el('p', {}, filter, ' ', start, ' ', stop, ' ', status),
    el('p', {class: 'dim'}, 'the last packets followed on this lab (here or with labctl follow), newest first; ' +
      'click one to see its path again'), list,
    el('h3', {}, 'Its hops'), el('p', {class: 'dim'}, 'each hop of the packet shown on the topology, with what ' +
      'happened to it there (an address rewritten, a rule, a verdict, a tunnel)'), hopList);
}

// ---- the class's progress over time: an inline SVG drawn here (no library) -------------------
const SVG_NS = 'http://www.w3.org/2000/svg';
const SERIES_COLOURS = ['#0969da', '#bf3989', '#1a7f37', '#9a6700', '#8250df', '#cf222e', '#1b7c83', '#57606a'];

function svgEl(tag, attrs, ...kids) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const kid of kids) e.append(kid instanceof Node ? kid : String(kid));
  return e;
}

function clock(epoch) {
  const d = new Date(epoch * 1000);
  return String(d.getHours()).padStart(2, '0') + ':' + String(d.getMinutes()).padStart(2, '0');
}

// p: {checks: [names], students: n, samples: [[epoch, all, n1, n2...]], now: [all, n1...]}
function progressChart(p) {
  const W = 640, H = 220, L = 36, R = 12, T = 12, B = 28;
  const n = Math.max(1, p.students);
  const samples = p.samples || [];
  const series = [{name: 'all checks', col: 1, colour: '#1d2330', width: 3},
    ...p.checks.map((c, i) => ({name: c, col: i + 2, colour: SERIES_COLOURS[i % SERIES_COLOURS.length], width: 1.5}))];
  const svg = svgEl('svg', {id: 'progress-chart', viewBox: `0 0 ${W} ${H}`, width: W, height: H,
    role: 'img', 'aria-label': 'students passing checks over time', 'data-samples': samples.length});
  const y = (v) => T + (H - T - B) * (1 - v / n);
  for (let v = 0; v <= n; v += Math.max(1, Math.ceil(n / 5))) {
    svg.append(svgEl('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#d8dce3', 'stroke-width': 1}));
    svg.append(svgEl('text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 11, fill: '#57606a'}, String(v)));
  }
  if (!samples.length) {
    svg.append(svgEl('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', 'font-size': 13, fill: '#57606a'},
      'no checks run yet'));
    return svg;
  }
  const t0 = samples[0][0];
  const t1 = Math.max(Date.now() / 1000, samples[samples.length - 1][0] + 1);
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  for (const s of series) {
    let d = '';
    samples.forEach((row, i) => {
      const v = row[s.col] || 0;
      d += i === 0 ? `M${x(row[0]).toFixed(1)},${y(v).toFixed(1)}` : `H${x(row[0]).toFixed(1)}V${y(v).toFixed(1)}`;
    });
    d += `H${x(t1).toFixed(1)}`;
    svg.append(svgEl('path', {d, fill: 'none', stroke: s.colour, 'stroke-width': s.width, 'data-series': s.name}));
  }
  svg.append(svgEl('text', {x: L, y: H - 8, 'font-size': 11, fill: '#57606a'}, clock(t0)));
  svg.append(svgEl('text', {x: W - R, y: H - 8, 'text-anchor': 'end', 'font-size': 11, fill: '#57606a'}, 'now'));
  return svg;
}

function progressBox(p) {
  const legend = el('ul', {class: 'legend'});
  const now = p.now || [];
  const entries = [['all checks', now[0] || 0, '#1d2330'],
    ...p.checks.map((c, i) => [c, now[i + 1] || 0, SERIES_COLOURS[i % SERIES_COLOURS.length]])];
  for (const [name, count, colour] of entries) {
    const swatch = el('span', {class: 'swatch'});
    swatch.style.background = colour;
    legend.append(el('li', {'data-series': name, 'data-count': count}, swatch, `${name}: ${count}/${p.students}`));
  }
  return [progressChart(p), legend];
}

// ---- the trainer's page ----------------------------------------------------------------------
function classPage() {
  const lab = body.dataset.lab;
  document.getElementById('who').textContent = body.dataset.who || '';
  const allow = el('input', {type: 'checkbox', id: 'allow-reset'});
  allow.addEventListener('change', () => post(`/api/class/${encodeURIComponent(lab)}/allow-reset`, {allow: allow.checked})
    .catch((e) => alert(e.message)));
  const allowFollow = el('input', {type: 'checkbox', id: 'allow-follow'});
  allowFollow.addEventListener('change', () => post(`/api/class/${encodeURIComponent(lab)}/allow-follow`,
    {allow: allowFollow.checked}).catch((e) => alert(e.message)));
  const table = el('table', {id: 'room'});
  const viewerTitle = el('h2', {id: 'viewer-title'}, 'Terminal');
  const viewer = el('div', {class: 'term', id: 'viewer'}, el('p', {}, 'open a student\'s terminal with “watch” or “help”'));
  const progress = el('div', {id: 'progress-box'});
  main.replaceChildren(el('p', {}, el('label', {}, allow, ' students may reset their own guests'), ' ',
    el('label', {}, allowFollow, ' students may follow packets on their labs')), table,
    el('section', {id: 'progress'}, el('h2', {}, 'Progress: students passing'), progress),
    el('section', {id: 'viewer-box'}, viewerTitle, viewer));
  let lastProgress = null;
  function drawProgress(p) {
    if (!p) return;
    lastProgress = p;
    progress.replaceChildren(...progressBox(p));
  }
  setInterval(() => drawProgress(lastProgress), 30000);  // the lines run on to "now"
  let current = null;
  function watch(ident, guest, mode) {
    if (current) current.stop('closed');
    viewerTitle.textContent = `${ident} ${guest} (${mode === 'rw' ? 'read-write: you type in the student\'s shell' : 'read-only'})`;
    current = openTerminal(viewer, ident, guest, mode);
  }
  function render(view) {
    if (view.error) { table.replaceChildren(el('tr', {}, el('td', {class: 'bad'}, view.error))); return; }
    allow.checked = view.allow_reset;
    allowFollow.checked = view.allow_follow;
    const guests = [...new Set(view.students.flatMap((s) => s.guests.map((g) => g.name)))];
    const head = el('tr', {}, el('th', {}, 'student'), ...guests.map((g) => el('th', {}, g)),
      el('th', {}, 'checks'), el('th', {}, 'last command'), el('th', {}, ''));
    const rows = view.students.map((s) => {
      const cells = guests.map((name) => {
        const g = s.guests.find((x) => x.name === name) || {name, state: 'down', panic: ''};
        const busy = (s.resetting || []).includes(name);
        return el('td', {class: 'cell', 'data-guest': name}, stateBadge(g),
          g.panic ? el('div', {class: 'panic'}, g.panic) : null,
          el('div', {class: 'actions'},
            el('button', {class: 'reset', disabled: busy || !s.up, onclick: () => post(
              `/api/lab/${encodeURIComponent(s.lab)}/reset/${encodeURIComponent(name)}`).catch((e) => alert(e.message))},
            busy ? 'resetting…' : 'reset'),
            el('button', {class: 'watch', disabled: !s.up, onclick: () => watch(s.lab, name, 'ro')}, 'watch'),
            el('button', {class: 'help', disabled: !s.up, onclick: () => watch(s.lab, name, 'rw')}, 'help')));
      });
      const c = s.checks;
      const ok = c.total > 0 && c.passed === c.total;
      return el('tr', {'data-student': s.student},
        el('td', {}, el('b', {}, s.student), el('div', {class: 'dim'}, s.lab)), ...cells,
        el('td', {class: 'checks-cell ' + (ok ? 'good' : c.ran_at ? 'bad' : ''), 'data-passed': c.passed, 'data-total': c.total},
          `${c.passed}/${c.total}`, c.failing.length ? el('div', {class: 'failing'}, c.failing.join(', ')) : null),
        el('td', {class: 'last-input', 'data-epoch': s.last_input}, ago(s.last_input)),
        el('td', {}, el('button', {class: 'check-now', disabled: !s.up || c.running, onclick: () => post(
          `/api/lab/${encodeURIComponent(s.lab)}/checks`).catch((e) => alert(e.message))}, c.running ? 'checking…' : 'check now')));
    });
    table.replaceChildren(el('thead', {}, head), el('tbody', {}, ...rows));
    drawProgress(view.progress);
  }
  subscribe('class=' + encodeURIComponent(lab), render);
  setInterval(() => document.querySelectorAll('td.last-input').forEach((td) => {
    td.textContent = ago(Number(td.dataset.epoch));
  }), 5000);
}

// ---- the owner's index -----------------------------------------------------------------------
function indexPage() {
  document.getElementById('who').textContent = body.dataset.who || '';
  fetch('/api/index', {credentials: 'same-origin'}).then((r) => r.json()).then((v) => {
    main.replaceChildren(
      el('h2', {}, 'Labs up'), el('ul', {}, ...v.labs.map((l) => el('li', {}, el('a', {href: '/lab/' + encodeURIComponent(l)}, l)))),
      el('h2', {}, 'Classes'), el('ul', {}, ...v.classes.map((c) => el('li', {}, el('a', {href: '/class/' + encodeURIComponent(c)}, c)))));
    setLive('', 'ok');
  }).catch((e) => setLive(e.message, 'bad'));
}

({lab: labPage, class: classPage, index: indexPage})[body.dataset.page]();
