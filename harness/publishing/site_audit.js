// `compat-matrix audit` in the browser: the same reading of a requirements file, pip freeze or lock, and the same
// judging of the advisories feed (harness/tools/audit.py), line for line, so the page answers with no server.
// tests/test_site_answer.py holds the two to the same answers on the same inputs. Keep them in step: a change to
// audit.py's judge, ways_out or cleared is a change here.
(function (root) {
  "use strict";

  // --- versions: packaging's Version, as far as the feed and users' pins need it -------------------------------
  const VERSION = /^\s*v?(?:(\d+)!)?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?(?:(?:-(\d+))|(?:[-_.]?(post|rev|r)[-_.]?(\d*)))?(?:[-_.]?(dev)[-_.]?(\d*))?\s*$/i;

  function publicVersion(v) { return String(v).split("+", 1)[0]; }

  function parseVersion(v) {
    const m = VERSION.exec(publicVersion(v));
    if (!m) return null;
    const pre = m[3] ? [{ a: 0, alpha: 0, b: 1, beta: 1, c: 2, rc: 2, pre: 2, preview: 2 }[m[3].toLowerCase()], Number(m[4] || 0)] : null;
    const post = m[5] !== undefined ? Number(m[5]) : (m[6] ? Number(m[7] || 0) : null);
    const dev = m[8] ? Number(m[9] || 0) : null;
    return { epoch: Number(m[1] || 0), release: m[2].split(".").map(Number), pre, post, dev };
  }

  // Python's Version(public_version(v)).release: the release numbers, compared as tuples (2.5 < 2.5.0).
  function releaseKey(v) {
    const parsed = parseVersion(v);
    if (!parsed) throw new Error(`not a version: ${v}`);
    return parsed.release;
  }
  function cmpTuple(a, b) {
    for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
    return a.length === b.length ? 0 : (a.length < b.length ? -1 : 1);
  }
  function cmpRelease(a, b) { return cmpTuple(releaseKey(a), releaseKey(b)); }

  // packaging's full ordering (trailing zeros of the release dropped; dev < pre < final < post).
  function versionKey(v) {
    const p = parseVersion(v);
    const release = p.release.slice();
    while (release.length > 1 && release[release.length - 1] === 0) release.pop();
    const pre = p.pre ? p.pre : (p.post === null && p.dev !== null ? [-Infinity] : [Infinity]);
    return [p.epoch, release, pre, p.post === null ? -Infinity : p.post, p.dev === null ? Infinity : p.dev];
  }
  function cmpVersion(a, b) {
    const x = versionKey(a), y = versionKey(b);
    if (x[0] !== y[0]) return x[0] < y[0] ? -1 : 1;
    const r = cmpTuple(x[1], y[1]);
    if (r) return r;
    const q = cmpTuple(x[2], y[2]);
    if (q) return q;
    for (const i of [3, 4]) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
  }
  function isPrerelease(v) { const p = parseVersion(v); return !!p && (p.pre !== null || p.dev !== null); }

  // --- requirements and specifiers ----------------------------------------------------------------------------
  function canonicalName(name) { return name.replace(/[-_.]+/g, "-").toLowerCase(); }

  const REQUIREMENT = /^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*\(?\s*([^;()]*?)\s*\)?\s*(;.*)?$/;
  const SPECIFIER = /^(~=|===|==|!=|<=|>=|<|>)\s*([^\s,;]+)$/;

  function parseRequirement(line) {
    const m = REQUIREMENT.exec(line);
    if (!m) return null;
    const specs = [];
    if (m[3]) {
      for (const part of m[3].split(",")) {
        const s = SPECIFIER.exec(part.trim());
        if (!s) return null;
        if (s[1] !== "===" && !parseVersion(s[2].replace(/\.\*$/, ""))) return null;
        specs.push({ operator: s[1], version: s[2] });
      }
    }
    return { name: m[1], extras: m[2] || "", specs, marker: m[4] || "" };
  }

  // str(SpecifierSet): each specifier without spaces, sorted.
  function specifierText(specs) { return specs.map((s) => s.operator + s.version).sort().join(","); }

  function specifierContains(spec, v) {
    const op = spec.operator, want = spec.version;
    if (op === "===") return String(v) === want;
    if (op === "==" || op === "!=") {
      let hit;
      if (want.endsWith(".*")) {
        const prefix = releaseKey(want.slice(0, -2));
        const have = releaseKey(v).slice();
        while (have.length < prefix.length) have.push(0);
        hit = prefix.every((n, i) => have[i] === n);
      } else {
        hit = cmpVersion(want.includes("+") ? v : publicVersion(v), want) === 0;
      }
      return op === "==" ? hit : !hit;
    }
    if (op === "~=") {
      const key = releaseKey(want);
      const prefix = key.slice(0, -1).join(".");
      return cmpVersion(v, want) >= 0 && specifierContains({ operator: "==", version: prefix + ".*" }, v);
    }
    const c = cmpVersion(publicVersion(v), want);
    if (op === "<=") return c <= 0;
    if (op === ">=") return c >= 0;
    if (op === "<") return c < 0 && !(isPrerelease(v) && cmpTuple(releaseKey(v), releaseKey(want)) === 0);
    if (op === ">") return c > 0 && !(parseVersion(v).post !== null && cmpTuple(releaseKey(v), releaseKey(want)) === 0);
    return false;
  }
  // SpecifierSet.contains: every specifier holds; a pre-release only where a specifier names one.
  function setContains(specs, v) {
    if (isPrerelease(v) && !specs.some((s) => isPrerelease(s.version.replace(/\.\*$/, "")))) return false;
    return specs.every((s) => specifierContains(s, v));
  }

  // --- what the user has (audit.read_pins) -------------------------------------------------------------------
  function looksLikeLock(text) { return /^\s*\[\[(package|packages)\]\]\s*$/m.test(text); }

  // -> {pins: {package: version}, loose: [requirement text], kind: "lock" | "requirements"}; throws on bad input.
  function readPins(text, kind) {
    kind = kind || (looksLikeLock(text) ? "lock" : "requirements");
    return kind === "lock" ? { pins: lockPins(text), loose: [], kind } : Object.assign(requirementPins(text), { kind });
  }

  // uv.lock, poetry.lock ([[package]]) and pylock.toml ([[packages]]): each entry's own name and version keys.
  function lockPins(text) {
    const pins = {};
    let entry = null, number = 0, any = false;
    const close = () => {
      if (entry === null) return;
      if (!("name" in entry)) throw new Error(`package entry ${number} has no name`);
      if (entry.version) pins[canonicalName(entry.name)] = entry.version;
    };
    for (const raw of text.split(/\r?\n/)) {
      if (/^\s*\[\[(package|packages)\]\]\s*$/.test(raw)) { close(); entry = {}; number += 1; any = true; continue; }
      if (/^\s*\[/.test(raw)) { close(); entry = null; continue; }  // another table: that entry's keys end
      const m = /^(name|version)\s*=\s*(?:"([^"]*)"|'([^']*)')\s*$/.exec(raw);
      if (m && entry !== null) entry[m[1]] = m[2] !== undefined ? m[2] : m[3];
    }
    close();
    if (!any) throw new Error("no [[package]] or [[packages]] table: not a uv, poetry or PEP 751 lock");
    return pins;
  }

  function requirementPins(text) {
    const pins = {}, loose = [];
    text.split(/\r\n|\n|\r/).forEach((raw, index) => {
      const line = raw.split(" #", 1)[0].trim();
      if (!line || line.startsWith("#") || line.startsWith("-")) return;
      if (line.includes(" @ ") || /^(git\+|http|file:|\.|\/)/.test(line)) { loose.push(line); return; }
      const requirement = parseRequirement(line.replace(/\\+$/, "").trim());
      if (!requirement) throw new Error(`line ${index + 1}: ${JSON.stringify(raw.trim())} is not a requirement`);
      const exact = requirement.specs.filter((s) => (s.operator === "==" || s.operator === "===") && !s.version.includes("*"));
      if (exact.length) pins[canonicalName(requirement.name)] = exact[0].version;
      else loose.push(requirement.name + requirement.extras + specifierText(requirement.specs) + (requirement.marker ? "; " + requirement.marker.slice(1).trim() : ""));
    });
    return { pins, loose };
  }

  // audit.loose_ranges: package -> its specifiers, for a requirement that pins no release.
  function looseRanges(loose) {
    const found = {};
    for (const line of loose) {
      const r = parseRequirement(line);
      if (r) found[canonicalName(r.name)] = r.specs;
    }
    return found;
  }

  // --- judging (audit.judge and its helpers) ------------------------------------------------------------------
  const firstValue = (event) => event[Object.keys(event)[0]];
  const firstKey = (event) => Object.keys(event)[0];

  function affected(events, version) {
    let state = false;
    const sorted = events.slice().sort((x, y) => cmpRelease(firstValue(x), firstValue(y)));
    for (const event of sorted) {
      if (cmpRelease(firstValue(event), version) > 0) break;
      state = firstKey(event) === "introduced";
    }
    return state;
  }

  function sameSetup(keys, setup) {
    return Object.entries(setup).every(([k, v]) => !(k in keys) || keys[k] === v);
  }

  function clearedBy(facts, setup) {
    for (const fix of facts.workarounds || []) {
      const wanted = fix.setup || {};
      if (Object.keys(wanted).length && Object.entries(wanted).every(([k, v]) => setup[k] === v)) return String(fix.variant);
    }
    return null;
  }

  function unmeasured(facts, pkg, have) {
    const measured = ((facts.measured || {})[pkg] || []).slice().sort(cmpRelease);
    if (!measured.length) return "";
    const key = releaseKey(have);
    if (cmpTuple(key, releaseKey(measured[0])) < 0 || cmpTuple(key, releaseKey(measured[measured.length - 1])) > 0) {
      return `${pkg} ${have} lies outside the releases measured for it (${measured[0]} to ${measured[measured.length - 1]})`;
    }
    for (const entry of facts.evidence || []) {
      if (entry.package !== pkg) continue;
      for (const event of entry.events) {
        const release = event.introduced || event.fixed;
        if (event.bound === "earliest measured" && release && cmpTuple(key, releaseKey(release)) < 0) {
          return `${pkg} ${have} is older than ${release}, the oldest release this failure was measured with (older ones ran only under other releases of the rest)`;
        }
        const before = (event.before || {}).release;
        if (release && before && cmpTuple(releaseKey(before), key) < 0 && cmpTuple(key, releaseKey(release)) < 0) {
          return `${pkg} ${have} lies between ${before} and ${release}, where the change was found, unmeasured`;
        }
      }
    }
    return "";
  }

  function toMeasure(facts, pins) {
    const asked = facts.conditions.filter((c) => c.package in pins).map((c) => `${c.package}==${pins[c.package]}`).join(" ");
    return `run \`compat-matrix lookup ${asked ? asked + " " : ""}--scenario ${facts.scenario} --measure\``;
  }

  function sureness(facts, pins) {
    const off = facts.conditions
      .filter((c) => !((facts.measured || {})[c.package] || []).some((m) => cmpRelease(m, pins[c.package]) === 0))
      .map((c) => `${c.package} ${pins[c.package]}`);
    if (!off.length) return "measured at these exact releases";
    return `not measured at ${off.join(", ")} exactly (the releases measured around it fail): ${toMeasure(facts, pins)}`;
  }

  function finding(advisory, state, why, sure) { return { advisory, state, why, sure: sure || "", way_out: [] }; }

  function judge(advisory, pins, setup, ranges, partial, gpus) {
    const facts = advisory.database_specific;
    if (gpus === 0 && facts.device !== "cpu") return null;
    if (Object.keys(setup).length && (facts.setup_keys || []).length && !facts.setup_keys.some((k) => sameSetup(k, setup))) return null;
    if (clearedBy(facts, setup)) return null;
    const undecided = [], admitted = [];
    for (const condition of facts.conditions) {
      const pkg = condition.package, events = condition.events;
      const have = pins[pkg];
      if (have === undefined && ranges && pkg in ranges) {
        const allowedBy = ranges[pkg];
        const allowed = ((facts.measured || {})[pkg] || []).filter((v) => setContains(allowedBy, v));
        const bad = allowed.filter((v) => affected(events, v));
        const text = specifierText(allowedBy) || "(any)";
        if (bad.length) { admitted.push(`${pkg} ${text} admits ${bad.join(", ")}`); continue; }
        if (allowed.length) return null;
        undecided.push(`${pkg} ${text} holds no release measured for it`);
        continue;
      }
      if (have === undefined && partial) {
        undecided.push(`${pkg} is not in your files (installed apart? give its release: a lock, --env)`);
        continue;
      }
      if (have === undefined) return null;
      const gap = unmeasured(facts, pkg, have);
      if (gap) { undecided.push(gap); continue; }
      if (!affected(events, have)) return null;
    }
    const sizes = facts.world_size || [];
    if (gpus && facts.device !== "cpu" && sizes.length && !sizes.includes(gpus)) {
      undecided.push(`measured on ${sizes.join(" and ")} GPUs, not on ${gpus}`);
    }
    if (undecided.length) return finding(advisory, "undecided", undecided.join("; "), toMeasure(facts, pins));
    if (admitted.length) return finding(advisory, "range", admitted.join("; "), "a range you allow admits a release measured failing");
    const have = facts.conditions.map((c) => `${c.package} ${pins[c.package]}`).join(", ");
    return finding(advisory, "applies", have, sureness(facts, pins));
  }

  function applying(every, pins, setup, gpus) {
    const found = new Set();
    for (const a of every) {
      const f = judge(a, pins, setup, null, false, gpus);
      if (f && f.state === "applies") found.add(a.id);
    }
    return found;
  }

  function measuredGoodBefore(facts, pkg, have) {
    for (const entry of facts.evidence || []) {
      if (entry.package !== pkg) continue;
      const covering = entry.events.filter((e) => "introduced" in e && cmpRelease(e.introduced, have) <= 0);
      const before = covering.length ? (covering[covering.length - 1].before || {}) : {};
      if ((before.records || []).length && before.records.every((r) => r.outcome === "pass")) return before.release;
    }
    return null;
  }

  function waysOut(findings, pins, every, setup, gpus) {
    const now = applying(every, pins, setup, gpus);
    for (const f of findings.filter((x) => x.state === "applies")) {
      const facts = f.advisory.database_specific;
      for (const condition of facts.conditions) {
        const pkg = condition.package;
        const fixes = condition.events.filter((e) => "fixed" in e && cmpRelease(e.fixed, pins[pkg]) > 0)
          .map((e) => e.fixed).sort(cmpRelease);
        let clear = null;
        for (const fix of fixes) {
          const after = applying(every, Object.assign({}, pins, { [pkg]: fix }), setup, gpus);
          if (!after.has(f.advisory.id) && [...after].every((id) => now.has(id))) { clear = fix; break; }
        }
        if (clear) { f.way_out.push(`upgrade ${pkg} to ${clear}`); continue; }
        const before = measuredGoodBefore(facts, pkg, pins[pkg]);
        f.way_out.push(before ? `no release of ${pkg} after yours ends it: pin ${pkg} ${before}` : `no measured release of ${pkg} ends it`);
      }
      const changes = (facts.workarounds || []).map((w, i) => [w, i])
        .sort((x, y) => ((x[0].kind !== "fix") - (y[0].kind !== "fix")) || (x[1] - y[1])).map(([w]) => w);
      for (const w of changes.slice(0, 3)) f.way_out.push(`${w.kind}: ${w.words || w.variant}`);
      if (changes.length > 3) f.way_out.push(`${changes.length - 3} more measured changes in ${f.advisory.id}.json`);
    }
  }

  const ORDER = { applies: 0, undecided: 1, range: 2, cleared: 3 };

  // audit.audit: every advisory judged, the ways out, and those the setup's own settings clear; sorted as audit does.
  function audit(advisories, pins, setup, options) {
    options = options || {};
    const ignore = new Set(options.ignore || []);
    let every = advisories.filter((a) => !ignore.has(a.id));
    if (options.device) every = every.filter((a) => a.database_specific.device === options.device);
    const gpus = options.gpus === undefined ? null : options.gpus;
    const found = [];
    for (const a of every) {
      const f = judge(a, pins, setup, options.ranges || null, !!options.partial, gpus);
      if (f) found.push(f);
    }
    waysOut(found, pins, every, setup, gpus);
    const withoutContext = Object.fromEntries(Object.entries(setup).filter(([k]) => k !== "state_dict"));
    for (const a of every) {
      const fix = clearedBy(a.database_specific, setup);
      if (fix && judge(a, pins, withoutContext, null, false, gpus) !== null) {
        const words = ((a.database_specific.workarounds || []).find((w) => w.variant === fix) || {}).words || fix;
        found.push(finding(a, "cleared", `your setup has ${words}, which the records show passing where it failed`));
      }
    }
    return found.sort((x, y) => (ORDER[x.state] - ORDER[y.state]) || (x.advisory.id < y.advisory.id ? -1 : x.advisory.id > y.advisory.id ? 1 : 0));
  }

  // What the JSON format of `compat-matrix audit` prints for the same findings.
  function asJson(findings) {
    return findings.map((f) => ({
      id: f.advisory.id, state: f.state, summary: f.advisory.summary, why: f.why, sure: f.sure,
      setups: f.advisory.database_specific.setups, way_out: f.way_out,
    }));
  }

  const api = { readPins, looseRanges, judge, audit, asJson, affected, releaseKey, cmpRelease, setContains, parseRequirement, canonicalName };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.CompatAudit = api;
})(typeof window !== "undefined" ? window : this);
