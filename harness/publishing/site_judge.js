// The judge's fold in the browser: the user's releases looked up in the tables Python compiled
// (harness/knowledge/tables.py, written as data/judge.js), then the same fold as harness/knowledge/judge.py `evaluate`
// and the same search as harness/knowledge/ways_out.py `way_out`. Nothing is judged here that Python did not decide:
// the segments and points carry every decision and its words. tests/test_judge_vectors.py runs one table of test
// vectors through both (node, and the page in Chromium) and holds them to the same JSON.
(function (root) {
  "use strict";

  const AFFECTED = "affected", CLEAR = "clear", UNMEASURED = "unmeasured";
  const SHOWS = "shows", PASSES = "passes", OTHER = "other";
  const STATES = ["applies", "applies-if", "range", "undecided", "pitfall", "cleared", "clean", "not-applicable"];
  const BLOCKING = ["applies", "applies-if"];
  const ENDED = ["clean", "not-applicable", "cleared"];
  const MOST_MOVES = 3, MOST_TRIES = 4000, MOST_ROUNDS = 3, MOST_BROUGHT = 4, MOST_UNBLOCKING = 6;
  const RELEASE = /^\s*v?(?:\d+!)?(\d+(?:\.\d+)*)/;

  // --- versions: the release numbers, padded (judge.key) -----------------------------------------------------------
  const KEYS = new Map();  // a way-out search compares the same few hundred releases millions of times
  function key(version) {
    const text = String(version);
    let parts = KEYS.get(text);
    if (parts === undefined) {
      const found = RELEASE.exec(text.split("+", 1)[0]);
      parts = found ? found[1].split(".").map(Number) : [];
      while (parts.length < 6) parts.push(0);
      parts = Object.freeze(parts.slice(0, 6));
      KEYS.set(text, parts);
    }
    return parts;
  }
  // Python's ordering of nested tuples and lists of numbers and strings.
  function cmp(a, b) {
    if (Array.isArray(a)) {
      for (let i = 0; i < Math.min(a.length, b.length); i++) { const c = cmp(a[i], b[i]); if (c) return c; }
      return a.length - b.length;
    }
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function prefixBounds(version) {
    const parts = key(version);
    const found = RELEASE.exec(String(version).split("+", 1)[0]);
    const given = found ? Math.min(6, found[1].split(".").length) : 1;
    const high = parts.slice(0, given);
    high[high.length - 1] += 1;
    while (high.length < 6) high.push(0);
    return [parts, high];
  }
  function matches(have, want, prefix) {
    if (have === null || have === undefined) return false;
    if (!prefix) return cmp(key(have), key(want)) === 0;
    const [low, high] = prefixBounds(want);
    const at = key(have);
    return cmp(low, at) <= 0 && cmp(at, high) < 0;
  }
  function agrees(have, want, narrowing) {
    return Object.entries(want).every(([k, v]) => !(k in have) || !narrowing.includes(k) || have[k] === v);
  }

  // --- segments ----------------------------------------------------------------------------------------------------
  function segmentOf(segments, version) {
    const at = key(version);
    for (const s of segments) {
      const above = s[0] === null || cmp(key(s[0]), at) < 0 || (s[1] && cmp(key(s[0]), at) === 0);
      const below = s[2] === null || cmp(at, key(s[2])) < 0 || (s[3] && cmp(key(s[2]), at) === 0);
      if (above && below) return s;
    }
    return [null, false, null, false, UNMEASURED, `${version}: no release measured near it`];
  }
  function segmentsOver(segments, version) {
    const [low, high] = prefixBounds(version);
    return segments.filter((s) => {
      const sLow = s[0] === null ? null : key(s[0]);
      const sHigh = s[2] === null ? null : key(s[2]);
      const startsBelow = sHigh === null || cmp(low, sHigh) < 0 || (s[3] && cmp(low, sHigh) === 0);
      const endsAbove = sLow === null || cmp(sLow, high) < 0;
      return startsBelow && endsAbove;
    });
  }
  function decide(segments, version, prefix) {
    if (!prefix) { const s = segmentOf(segments, version); return [s[4], s[5]]; }
    const over = segmentsOver(segments, version);
    const states = new Set(over.map((s) => s[4]));
    if (states.size === 1) return [over[0][4], over[0][5]];
    if ([...states].every((s) => s === AFFECTED || s === "measured")) return [AFFECTED, over.map((s) => s[5]).join("; ")];
    return [UNMEASURED, `${version} names releases that differ: ` + over.map((s) => s[5]).join("; ")];
  }

  // --- the fold (judge.evaluate) -----------------------------------------------------------------------------------
  function query(q) {
    return Object.assign({ versions: {}, setup: {}, device: null, gpus: null, partial: false, prefix: [], ranges: {}, ignore: [] }, q);
  }
  function answer(failure, state, why, sure, more) {
    return Object.assign({ id: failure.id, scenario: failure.scenario, device: failure.device, state, why, sure: sure || "" }, more || {});
  }
  function evaluate(tables, q) {
    q = query(q);
    const narrowing = tables.narrowing;
    const answers = tables.failures.filter((f) => !q.ignore.includes(f.id)).map((f) => judgeOne(f, q, narrowing, tables));
    for (const p of tables.pitfalls) answers.push(pitfall(p, q, narrowing));
    return answers.sort((a, b) => (STATES.indexOf(a.state) - STATES.indexOf(b.state)) || cmp(a.id, b.id));
  }
  function hasSetting(setup, fix) {
    const setting = fix.setup || {};
    return Object.keys(setting).length > 0 && Object.entries(setting).every(([k, v]) => setup[k] === v);
  }
  function withSetting(failure, found, fixed, when) {
    const said = `your setup has ${fixed.words}`;
    if (fixed.state === FIXES) return answer(failure, "cleared", `${said}, which fixes it here: ${fixed.why}`, fixed.sure, { when });
    if (fixed.state === NOT_FIXED) return answer(failure, "applies", `${said}, which does not fix it here: ${fixed.why}`, fixed.sure, { when });
    if (fixed.state === BRINGS) {
      return answer(failure, "undecided", `${said}; with it the runs here fail another way (${fixed.brings.join(", ")}): no evidence either way`, fixed.sure, { when });
    }
    return answer(failure, "undecided", `${said}, not measured at your releases, setup and GPU count (${fixed.where || "nowhere else either"}); without it: ${found.why}`, "unmeasured", { when });
  }
  function judgeOne(failure, q, narrowing, tables) {
    const device = deviceAnswer(failure, q, narrowing, tables);
    if (device) return device;
    const setups = [];
    failure.setups.forEach((s, i) => { if (agrees(s.keys, q.setup, narrowing)) setups.push(i); });
    if (!setups.length) return answer(failure, "not-applicable", "another setup");
    let found = byPoints(failure, q, setups) || bySegments(failure, q);
    if (!("setups" in found)) found.setups = setups.map((i) => failure.setups[i].keys);
    if (!("when" in found)) found.when = setups.map((i) => failure.setups[i].words).join("; ");
    const when = found.when;
    if (["applies", "undecided", "range"].includes(found.state)) {
      const held = failure.fixes.find((f) => hasSetting(q.setup, f));
      if (held) return withSetting(failure, found, fixAnswer(failure, held, q, setups), when);
    }
    if (["applies", "clean"].includes(found.state) && failure.distributed && failure.device === "cuda") {
      const sizes = failure.world_sizes;
      if (q.gpus && sizes.length && !sizes.includes(q.gpus)) {
        found = answer(failure, "undecided", `measured on ${sizes.join(" and ")} GPUs, not on ${q.gpus}`, "unmeasured", { when });
      }
    }
    if (found.state === "applies" && failure.detail) found = Object.assign({}, found, { state: "applies-if", condition: failure.detail });
    return found;
  }
  function deviceAnswer(failure, q, narrowing, tables) {
    if (q.device === null || q.device === failure.device) return null;
    if (failure.device === "cuda") return answer(failure, "not-applicable", "measured on GPUs; you train on CPU");
    const covered = tables.coverage[`${failure.scenario}@${q.device}`] || [];
    if (covered.some((s) => agrees(s, q.setup, narrowing))) return answer(failure, "not-applicable", "measured on CPU; the GPU records of this setup decide");
    if (!failure.setups.some((s) => agrees(s.keys, q.setup, narrowing))) return answer(failure, "not-applicable", "another setup");
    return answer(failure, "undecided", "measured on CPU only: no GPU record of this setup", "unmeasured", { when: failure.setups.map((s) => s.words).join("; ") });
  }
  const STATE_WORDS = { shows: "fails", passes: "passes", other: "fails another way", mixed: "passes on some configs" };
  function stackState(states) {
    const all = new Set(states);
    if (all.has("mixed")) { all.delete("mixed"); all.add(PASSES); all.add(OTHER); }
    if (all.has(SHOWS)) return SHOWS;
    if (all.size === 1 && all.has(PASSES)) return PASSES;
    return all.has(PASSES) ? "mixed" : OTHER;
  }
  function byPoints(failure, q, setups) {
    const depends = failure.depends;
    if (depends.some((p) => !(p in q.versions))) return null;
    const byStack = new Map();  // JSON of the stack -> {stack, setups: Map(index -> Set of states)}
    const refs = [];
    for (const [stack, setup, size, state, ref] of failure.points) {
      if (!setups.includes(setup) || (failure.distributed && failure.device === "cuda" && q.gpus && size !== q.gpus)) continue;
      if (depends.every((p, i) => matches(stack[i], q.versions[p], q.prefix.includes(p)))) {
        const at = JSON.stringify(stack);
        if (!byStack.has(at)) byStack.set(at, { stack, setups: new Map() });
        const found = byStack.get(at).setups;
        if (!found.has(setup)) found.set(setup, new Set());
        found.get(setup).add(state);
        refs.push(failure.refs[ref]);
      }
    }
    if (!byStack.size) return null;
    const entries = [...byStack.values()].sort((a, b) => cmp(a.stack.map(key), b.stack.map(key)));
    const verdicts = entries.map((e) => stackState([...e.setups.values()].flatMap((s) => [...s])));
    const states = new Set(verdicts);
    const at = depends.map((p, i) => `${p} ${entries[0].stack[i]}`).join(", ");
    const showing = [...new Set(entries.flatMap((e) => [...e.setups.entries()].filter(([, s]) => stackState([...s]) === SHOWS).map(([i]) => i)))].sort((x, y) => x - y);
    const evidence = refs.slice(0, 3);
    if (states.size === 1 && states.has(SHOWS)) {
      return answer(failure, "applies", `measured failing at ${at}`, "exact", {
        evidence, setups: showing.map((i) => failure.setups[i].keys), when: showing.map((i) => failure.setups[i].words).join("; "),
      });
    }
    if (states.size === 1 && states.has(PASSES)) return answer(failure, "clean", `measured passing at ${at}`, "exact", { evidence });
    if (entries.length > 1) {
      const words = entries.map((e, i) => `${depends.map((p, j) => `${p} ${e.stack[j]}`).join(", ")}: ${STATE_WORDS[verdicts[i]]}`).join("; ");
      return answer(failure, "undecided", `the releases asked name stacks that differ: ${words}`, "exact", { evidence });
    }
    return answer(failure, "undecided", `at ${at} its configs failed another way or differ: no evidence either way`, "exact", { evidence });
  }
  function bySegments(failure, q) {
    const unmeasured = [], clear = [], affected = [], admitted = [], missing = [];
    for (const p of failure.depends) {
      const segments = failure.segments[p];
      const conditioned = failure.conditions.includes(p);
      if (!(p in q.versions)) {
        if (conditioned && p in q.ranges) {
          const decided = q.ranges[p].map((v) => [v, decide(segments, v, false)]);
          const bad = decided.filter(([, d]) => d[0] === AFFECTED).map(([v]) => v);
          if (bad.length) admitted.push(`${p}: a range you allow admits ${bad.join(", ")}, measured failing`);
          else if (decided.some(([, d]) => d[0] === CLEAR)) clear.push(`${p}: the releases your range allows were measured clear`);
          else unmeasured.push(`${p}: your range holds no release measured for it`);
        } else if (conditioned && q.partial) {
          unmeasured.push(`${p} is not in your files (installed apart? give its release: a lock, --env)`);
        } else if (conditioned || !q.partial) {  // a lock or an environment without it: it is not installed
          return answer(failure, "not-applicable", `${p} is not installed`);
        } else {
          missing.push(p);
        }
        continue;
      }
      const [state, why] = decide(segments, q.versions[p], q.prefix.includes(p));
      if (state === UNMEASURED) unmeasured.push(why);
      else if (state === CLEAR) clear.push(why);
      else if (state === AFFECTED) affected.push(why);
    }
    const note = missing.length ? ` (${missing.join(", ")} not given)` : "";
    if (unmeasured.length) return answer(failure, "undecided", unmeasured.join("; "), "unmeasured");
    if (clear.length) return answer(failure, "clean", clear.join("; ") + note, "bracketed");
    if (admitted.length) return answer(failure, "range", admitted.join("; "), "bracketed");
    if (failure.shape === "mixed") {
      return answer(failure, "undecided", "its configs show it on some stacks and pass on others, and no release is named between: only a record at your releases decides", "unmeasured");
    }
    if (failure.shape === "everywhere") {
      if (missing.length) {  // no release bounds it: only the releases it was measured with decide, and these are not known
        return answer(failure, "undecided", `${missing.join(", ")} not given: a failure no release bounds is decided only where every release it depends on is known`, "unmeasured");
      }
      affected.push(failure.everywhere);
    }
    return answer(failure, "applies", affected.join("; ") + note, "bracketed");
  }
  // --- fixes, judged like failures (judge.fix_answers) --------------------------------------------------------------
  const FIXES = "fixes", BRINGS = "brings", NOT_FIXED = "does-not-fix", FIX_UNMEASURED = "unmeasured";
  const FIX_STATES = [FIXES, BRINGS, NOT_FIXED, FIX_UNMEASURED];
  const SURES = ["exact", "bracketed", "unmeasured"];
  const FIX_WORDS = { [FIXES]: "fixes it", [NOT_FIXED]: "fails the same way", [BRINGS]: "fails another way" };
  function stackWords(depends, stack) { return depends.map((p, i) => `${p} ${stack[i]}`).join(", "); }
  function fixState(states) {
    const found = stackState(states);
    return found === SHOWS ? NOT_FIXED : found === PASSES ? FIXES : BRINGS;
  }
  function sortedUnique(items) { return [...new Set(items)].sort(); }
  function fixAnswers(tables, failure, q) {
    q = query(q);
    const narrowing = tables.narrowing;
    let setups = [];
    failure.setups.forEach((s, i) => { if (agrees(s.keys, q.setup, narrowing)) setups.push(i); });
    if (!setups.length) setups = failure.setups.map((_, i) => i);
    const found = failure.fixes.map((fix) => fixAnswer(failure, fix, q, setups));
    return found.map((f, i) => [f, i]).sort((a, b) => (SURES.indexOf(a[0].sure) - SURES.indexOf(b[0].sure))
      || (FIX_STATES.indexOf(a[0].state) - FIX_STATES.indexOf(b[0].state))
      || ((a[0].kind !== "fix") - (b[0].kind !== "fix")) || (a[1] - b[1])).map(([f]) => f);
  }
  function fixAnswer(failure, fix, q, setups) {
    const sized = failure.distributed && failure.device === "cuda" && !!q.gpus;
    const mine = fix.points.filter((p) => setups.includes(p[1]));
    const points = mine.filter((p) => !sized || p[2] === q.gpus);
    const depends = failure.depends;
    const base = { variant: fix.variant, kind: fix.kind, words: fix.words, brings: [], evidence: [] };
    if (fix.setup) base.setup = fix.setup;
    const where = fixWhere(failure, mine);
    const missing = depends.filter((p) => !(p in q.versions));
    if (missing.length && (!q.partial || missing.some((p) => failure.conditions.includes(p)))) {
      const why = `${missing.join(", ")} not given: a fix is judged only where every release it depends on is known`;
      return Object.assign(base, { state: FIX_UNMEASURED, sure: "unmeasured", why, where });
    }
    const given = [];
    depends.forEach((p, i) => { if (p in q.versions) given.push(i); });
    const view = Object.assign({}, failure, { depends: given.map((i) => depends[i]) });
    const projected = points.map((p) => [given.map((i) => p[0][i]), ...p.slice(1)]);
    const note = missing.length ? ` (${missing.join(", ")} not given)` : "";
    const exact = projected.filter((p) => view.depends.every((d, i) => matches(p[0][i], q.versions[d], q.prefix.includes(d))));
    let found = exact.length ? fixExact(view, exact) : fixBracket(view, projected, q);
    if (found) {
      if (note && found.sure === "exact") found = Object.assign({}, found, { sure: "bracketed" });
      return Object.assign(base, found, { why: found.why + note, where });
    }
    const why = "not measured at these releases" + (sized ? ` on ${q.gpus} GPUs` : "") + note;
    return Object.assign(base, { state: FIX_UNMEASURED, sure: "unmeasured", why, where });
  }
  function fixExact(failure, exact) {
    const verdicts = new Map();  // JSON of the stack -> [stack, verdict], in the order the points come
    for (const p of exact) {
      const at = JSON.stringify(p[0]);
      if (!verdicts.has(at)) verdicts.set(at, [p[0], fixState(exact.filter((q) => JSON.stringify(q[0]) === at).map((q) => q[3]))]);
    }
    const others = sortedUnique(exact.flatMap((p) => p[4]));
    const stacks = [...verdicts.values()];
    const lowest = stacks.reduce((a, b) => (cmp(b[0].map(key), a[0].map(key)) < 0 ? b : a));
    const at = stackWords(failure.depends, lowest[0]);
    const evidence = exact.slice(0, 3).map((p) => failure.refs[p[5]]);
    if (new Set(stacks.map(([, v]) => v)).size > 1) {
      const words = stacks.map(([s, v]) => `${stackWords(failure.depends, s)}: ${FIX_WORDS[v]}`).join("; ");
      return { state: FIX_UNMEASURED, sure: "unmeasured", evidence, why: `the releases asked name stacks where it differs: ${words}` };
    }
    const state = stacks[0][1];
    const why = `measured: ${FIX_WORDS[state]} at ${at}` + (state === BRINGS ? ` (${others.join(", ")})` : "");
    return { state, sure: "exact", why, brings: state === BRINGS ? others : [], evidence };
  }
  function fixBracket(failure, points, q) {
    const depends = failure.depends;
    const stateAt = new Map();
    for (const p of points) {
      const at = JSON.stringify(p[0]);
      if (!stateAt.has(at)) stateAt.set(at, [p[0], []]);
      stateAt.get(at)[1].push(p[3]);
    }
    const verdicts = [...stateAt.values()].map(([s, found]) => [s, fixState(found)]);
    function side(stack, below) {
      return depends.every((p, i) => {
        const at = key(stack[i]);
        const prefix = q.prefix.includes(p);
        const [low, high] = prefix ? prefixBounds(q.versions[p]) : [key(q.versions[p]), key(q.versions[p])];
        return below ? cmp(at, low) <= 0 : cmp(at, prefix ? high : low) >= 0;
      });
    }
    let best = null;
    for (const [lo, vLo] of verdicts.filter(([s]) => side(s, true))) {
      for (const [hi] of verdicts.filter(([s, v]) => side(s, false) && v === vLo)) {
        const inside = verdicts.filter(([s]) => s.every((b, i) => cmp(key(lo[i]), key(b)) <= 0 && cmp(key(b), key(hi[i])) <= 0));
        if (inside.some(([, v]) => v !== vLo)) continue;
        const span = lo.reduce((n, a, i) => n + key(hi[i])[0] * 1000 + key(hi[i])[1] - key(a)[0] * 1000 - key(a)[1], 0);
        if (best === null || span < best[0]) best = [span, lo, hi, vLo];
      }
    }
    if (best === null) return null;
    const [, lo, hi, state] = best;
    const ends = [JSON.stringify(lo), JSON.stringify(hi)];
    const others = sortedUnique(points.filter((p) => ends.includes(JSON.stringify(p[0]))).flatMap((p) => p[4]));
    const why = `measured: ${FIX_WORDS[state]} at ${stackWords(depends, lo)} and at ${stackWords(depends, hi)}, the releases around yours`
      + (state === BRINGS ? ` (${others.join(", ")})` : "");
    return { state, sure: "bracketed", why, brings: state === BRINGS ? others : [] };
  }
  function fixWhere(failure, points) {
    const depends = failure.depends;
    const gpus = failure.device === "cuda";
    const grouped = new Map();  // "size|state" -> {size, state, stacks: Map(JSON -> stack)}
    for (const p of points) {
      const state = fixState([p[3]]);
      const size = gpus ? p[2] : 0;
      const at = `${size}|${state}`;
      if (!grouped.has(at)) grouped.set(at, { size, state, stacks: new Map() });
      grouped.get(at).stacks.set(JSON.stringify(p[0]), p[0]);
    }
    const groups = [...grouped.values()].sort((a, b) => (a.size - b.size) || (FIX_STATES.indexOf(a.state) - FIX_STATES.indexOf(b.state)));
    return groups.map(({ size, state, stacks }) => {
      const on = size ? ` on ${size} GPU${size > 1 ? "s" : ""}` : "";
      const ordered = [...stacks.values()].sort((a, b) => cmp(a.map(key), b.map(key)));
      let at;
      if (ordered.length === 1) at = stackWords(depends, ordered[0]);
      else {
        const spans = depends.map((_, i) => [...new Set(ordered.map((s) => s[i]))].sort((a, b) => cmp(key(a), key(b))));
        const moving = depends.map((p, i) => (spans[i].length > 1 ? `${p} ${spans[i][0]} to ${spans[i][spans[i].length - 1]}` : null)).filter((x) => x);
        at = `${ordered.length} stacks (${moving.join(", ")})`;
      }
      return `${FIX_WORDS[state]}${on} at ${at}`;
    }).join("; ");
  }
  function pitfall(p, q, narrowing) {
    const named = Object.keys(q.setup).filter((k) => narrowing.includes(k) && k in p.setup);
    const sameDevice = q.device === null || q.device === p.device;
    if (named.length && sameDevice && agrees(p.setup, q.setup, narrowing)) {
      return answer(p, "pitfall", p.why, "", { when: p.words, way_out: p.way_out });
    }
    return answer(p, "not-applicable", "another setup or device");
  }

  // --- ways out (ways_out.way_out) ---------------------------------------------------------------------------------
  function distance(version, have) {
    const at = key(version);
    if (have === null) return [0, at];
    if (cmp(at, have) > 0) return [0, at.map((a, i) => a - have[i])];
    return [1, at.map((a, i) => have[i] - a)];
  }
  function candidates(failures, q) {
    const found = {};
    for (const f of failures) {
      for (const p of f.conditions) {
        for (const s of f.segments[p]) {
          if (s[4] !== CLEAR) continue;
          found[p] = found[p] || new Set();
          for (const v of [s[0], s[2]]) if (v) found[p].add(v);
        }
      }
    }
    const out = {};
    for (const p of Object.keys(found).sort()) {
      const have = p in q.versions ? key(q.versions[p]) : null;
      out[p] = [...found[p]].sort().filter((v) => have === null || cmp(key(v), have) !== 0)
        .map((v) => [distance(v, have), v]).sort((a, b) => cmp(a[0], b[0])).map(([, v]) => v);
    }
    return out;
  }
  function moved(q, moves) { return Object.assign({}, q, { versions: Object.assign({}, q.versions, moves) }); }
  function score(moves, q, after) {
    const undecided = after.filter((a) => a.state === "undecided").length;
    const d = Object.entries(moves).map(([p, v]) => distance(v, p in q.versions ? key(q.versions[p]) : null));
    return [undecided, Object.keys(moves).length, d.reduce((n, x) => n + x[0], 0), d.map((x) => x[1]).sort(cmp),
      Object.entries(moves).sort((a, b) => cmp(a[0], b[0]))];
  }
  function combinations(items, size) {
    if (size === 0) return [[]];
    const out = [];
    items.forEach((item, i) => { for (const rest of combinations(items.slice(i + 1), size - 1)) out.push([item, ...rest]); });
    return out;
  }
  function product(lists) {
    return lists.reduce((acc, list) => acc.flatMap((a) => list.map((x) => [...a, x])), [[]]);
  }
  // installable.py: a moved release's Requires-Dist met by the stack, bringing the nearest measured release along.
  function clause(op, want, version, have) {
    if (op === "===") return version === want;
    if ((op === "==" || op === "!=") && want.endsWith(".*")) {
      const [low, high] = prefixBounds(want.slice(0, -2));
      const inside = cmp(low, have) <= 0 && cmp(have, high) < 0;
      return op === "==" ? inside : !inside;
    }
    const at = key(want), c = cmp(have, at);
    if (op === "~=") {
      const [low, high] = prefixBounds(want.slice(0, want.lastIndexOf(".")));
      return c >= 0 && cmp(low, have) <= 0 && cmp(have, high) < 0;
    }
    return { "==": c === 0, "!=": c !== 0, "<=": c <= 0, ">=": c >= 0, "<": c < 0, ">": c > 0 }[op];
  }
  function admits(specifier, version) {
    const have = key(version);
    return specifier.split(",").map((c) => c.trim()).filter(Boolean).every((c) => {
      const op = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"].find((o) => c.startsWith(o));
      return clause(op, c.slice(op.length).trim(), version, have);
    });
  }
  function refusal(declared, stack, moves) {
    for (const needer of Object.keys(stack).sort()) {
      const needs = (declared[needer] || {})[stack[needer]] || {};
      for (const dep of Object.keys(needs).sort()) {
        if (dep in stack && (needer in moves || dep in moves) && !admits(needs[dep], stack[dep])) return [needer, dep, needs[dep]];
      }
    }
    return null;
  }
  function complete(tables, versions, start) {
    const declared = tables.declared || {};
    const moves = Object.assign({}, start);
    for (let i = 0; i <= MOST_BROUGHT; i++) {
      const stack = Object.assign({}, versions, moves);
      const found = refusal(declared, stack, moves);
      if (found === null) return moves;
      const [needer, dep, specifier] = found;
      let choices, target;
      if (!(dep in moves)) {
        choices = (tables.releases[dep] || []).filter((v) => admits(specifier, v));
        target = dep;
      } else if (!(needer in moves)) {
        const mine = declared[needer] || {};
        choices = (tables.releases[needer] || []).filter((v) => v in mine && admits(mine[v][dep] || "", stack[dep]));
        target = needer;
      } else return null;
      choices = choices.filter((v) => !measuredBroken(tables, versions, Object.assign({}, moves, { [target]: v }), target));
      if (!choices.length) return null;
      const have = target in versions ? key(versions[target]) : null;
      moves[target] = choices.map((v) => [[distance(v, have), key(v)], v]).sort((a, b) => cmp(a[0], b[0]))[0][1];
    }
    return null;
  }
  function unblocking(tables, q, cands) {
    const found = {};
    for (const b of tables.broken || []) {
      for (const p of b.packages || []) {
        const have = p in q.versions ? q.versions[p] : null;
        if (p in cands || p in found || have === null || b.versions[p] !== have) continue;
        const releases = (tables.releases[p] || []).filter((v) => cmp(key(v), key(have)) !== 0);
        found[p] = releases.map((v) => [distance(v, key(have)), v]).sort((a, b2) => cmp(a[0], b2[0])).map(([, v]) => v).slice(0, MOST_UNBLOCKING);
      }
    }
    return found;
  }
  function measuredBroken(tables, versions, moves, involving) {
    const stack = Object.assign({}, versions, moves);
    return (tables.broken || []).some((b) => {
      const between = (b.packages && b.packages.length) ? b.packages : Object.keys(b.versions).sort();
      if (!between.some((p) => p in moves) || between.some((p) => !(p in stack))) return false;
      if (involving !== undefined && !between.includes(involving)) return false;
      if (between.every((p) => stack[p] === b.versions[p])) return true;
      const caller = b.caller, callee = b.callee;
      if (!caller || !callee || cmp(key(stack[caller]), key(b.versions[caller])) < 0) return false;
      if (cmp(key(stack[callee]), key(b.versions[callee])) > 0) return false;
      return !(b.ran || []).some(([x, y]) => x === stack[caller] && y === stack[callee]);
    });
  }
  function unsettled(after, ending, stays) {
    return after.filter((a) => (BLOCKING.includes(a.state) && !stays.has(a.id)) || (ending.has(a.id) && !ENDED.includes(a.state))).map((a) => a.state);
  }
  function search(tables, q, cands, stays, ending, before, tried) {
    let closest = null;
    const brought = new Set();
    const packages = Object.keys(cands).sort();
    for (let size = 1; size <= Math.min(MOST_MOVES, packages.length); size++) {
      let best = null;
      for (const chosen of combinations(packages, size)) {
        for (const releases of product(chosen.map((p) => cands[p]))) {
          if (tried >= MOST_TRIES) break;
          tried += 1;
          const moves = complete(tables, q.versions, Object.fromEntries(chosen.map((p, i) => [p, releases[i]])));
          if (moves === null || measuredBroken(tables, q.versions, moves)) continue;
          const after = evaluate(tables, moved(q, moves));
          for (const a of after) if (BLOCKING.includes(a.state) && !before.has(a.id) && !stays.has(a.id)) brought.add(a.id);
          const left = unsettled(after, ending, stays);
          const s = [left.filter((x) => x === "applies").length, left.filter((x) => x === "applies-if").length, left.length, ...score(moves, q, after)];
          if (!left.length && (best === null || cmp(s, best[0]) < 0)) best = [s, moves, after];
          if (closest === null || cmp(s, closest[0]) < 0) closest = [s, moves, after];
        }
      }
      if (best !== null) return [[best[1], best[2], true], tried, brought];
    }
    return [closest ? [closest[1], closest[2], false] : null, tried, brought];
  }
  function nearestFirst(p, releases, q) {
    const have = p in q.versions ? key(q.versions[p]) : null;
    return [...releases].sort().filter((v) => have === null || cmp(key(v), have) !== 0)
      .map((v) => [distance(v, have), v]).sort((a, b) => cmp(a[0], b[0])).map(([, v]) => v);
  }
  function widened(cands, more, q) {
    const merged = {};
    for (const [p, v] of Object.entries(cands)) merged[p] = new Set(v);
    for (const [p, v] of Object.entries(more)) { merged[p] = merged[p] || new Set(); for (const x of v) merged[p].add(x); }
    const out = {};
    for (const p of Object.keys(merged).sort()) out[p] = nearestFirst(p, merged[p], q);
    return out;
  }
  function searchedWords(cands, tried) {
    const releases = Object.values(cands).reduce((n, v) => n + v.length, 0);
    const over = `${releases} measured release(s) of ${Object.keys(cands).join(", ")} (each ends a failure of yours or one a move brings, or unblocks a stack measured not to run)`;
    if (tried >= MOST_TRIES) return `stopped after ${MOST_TRIES} stacks judged, before every set of up to ${MOST_MOVES} moves over ${over}`;
    return `every set of up to ${MOST_MOVES} moves over ${over}: ${tried} stacks judged`;
  }
  function noReleaseWords(p, decided) {
    return decided.some((s) => s[4] === CLEAR) ? `no measured release of ${p} ends it without another failure` : `no measured release of ${p} ends it`;
  }
  function singleMoves(tables, q, failure, before) {
    const blocking = new Set(before.filter((a) => BLOCKING.includes(a.state)).map((a) => a.id));
    const notes = [];
    for (const p of failure.conditions) {
      const have = p in q.versions ? q.versions[p] : null;
      let done = false;
      for (const release of candidates([failure], q)[p] || []) {
        const moves = complete(tables, q.versions, { [p]: release });
        if (moves === null || measuredBroken(tables, q.versions, moves)) continue;
        const after = evaluate(tables, moved(q, moves));
        const states = Object.fromEntries(after.map((a) => [a.id, a.state]));
        if (!ENDED.includes(states[failure.id])) continue;  // still there, or not measured there: not ended
        const now = new Set(Object.entries(states).filter(([, s]) => BLOCKING.includes(s)).map(([i]) => i));
        notes.push({
          package: p, release, from: have,
          direction: have === null || cmp(key(release), key(have)) > 0 ? "upgrade" : "downgrade",
          ends: [...blocking].filter((i) => !now.has(i)).sort(), brings: [...now].filter((i) => !blocking.has(i)).sort(),
          along: Object.fromEntries(Object.entries(moves).filter(([k]) => k !== p).sort((a, b) => cmp(a[0], b[0]))),
        });
        done = true;
        break;
      }
      if (!done) {
        const decided = failure.segments[p].filter((s) => s[4] === AFFECTED || s[4] === CLEAR);
        notes.push({ package: p, release: null, from: have, direction: null, ends: [], brings: [], why: noReleaseWords(p, decided) });
      }
    }
    return notes;
  }
  function noneWords(cands, tried) {
    if (!Object.keys(cands).length) return "no measured release ends them: the way out is a change of the setup (their fixes)";
    if (tried >= MOST_TRIES) return `no set of moves found before the search stopped (${MOST_TRIES} stacks judged)`;
    return `no set of up to ${MOST_MOVES} release moves leaves every known failure behind (searched ${searchedWords(cands, tried)})`;
  }
  function wayOut(tables, q, answers) {
    q = query(q);
    answers = answers || evaluate(tables, q);
    const blocking = answers.filter((a) => BLOCKING.includes(a.state));
    if (!blocking.length) return { pins: {}, from: {}, leaves: [], ends: [], stays: [], notes: {}, none: "" };
    const ids = new Set(blocking.map((a) => a.id));
    const byId = Object.fromEntries(tables.failures.filter((f) => ids.has(f.id)).map((f) => [f.id, f]));
    const movable = Object.values(byId).filter((f) => Object.keys(candidates([f], q)).length);
    const stays = Object.keys(byId).filter((i) => !movable.some((f) => f.id === i)).sort();
    let cands = candidates(movable, q);
    Object.assign(cands, unblocking(tables, q, cands));
    const notes = Object.fromEntries(Object.entries(byId).map(([i, f]) => [i, singleMoves(tables, q, f, answers)]));
    const ending = new Set(movable.map((f) => f.id));
    let found = null, tried = 0;
    for (let round = 0; round < (movable.length ? MOST_ROUNDS : 0); round++) {
      let brought;
      [found, tried, brought] = search(tables, q, cands, new Set(stays), ending, ids, tried);
      if (found === null || found[2] || tried >= MOST_TRIES) break;
      const wider = widened(cands, candidates(tables.failures.filter((f) => brought.has(f.id)), q), q);
      const canonical = (c) => JSON.stringify(Object.keys(c).sort().map((p) => [p, c[p]]));
      if (canonical(wider) === canonical(cands)) break;
      cands = wider;
    }
    const searched = searchedWords(cands, tried);
    if (found === null) return { pins: {}, from: {}, leaves: [], ends: [], stays, notes, searched, none: noneWords(cands, tried) };
    const [moves, after, whole] = found;
    const states = Object.fromEntries(after.map((a) => [a.id, a.state]));
    const blockingAfter = Object.keys(states).filter((i) => BLOCKING.includes(states[i]) && !stays.includes(i));
    return {
      pins: moves,
      from: Object.fromEntries(Object.keys(moves).map((p) => [p, p in q.versions ? q.versions[p] : null])),
      leaves: Object.keys(states).filter((i) => states[i] === "undecided").sort(),
      ends: [...ending].filter((i) => ENDED.includes(states[i])).sort(),
      stays,
      still: [...new Set([...blockingAfter.filter((i) => ids.has(i)), ...[...ending].filter((i) => !ENDED.includes(states[i]))])].sort(),
      brings: blockingAfter.filter((i) => !ids.has(i)).sort(),
      notes,
      searched,
      none: whole ? "" : noneWords(cands, tried) + "; the closest set is given, and what it leaves",
    };
  }

  const api = { evaluate, wayOut, fixAnswers, key, cmp, matches, admits, complete };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.CompatJudge = api;
})(typeof window !== "undefined" ? window : this);
