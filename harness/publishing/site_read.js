// What the user has, read in the browser as `compat-matrix audit` reads it (harness/tools/audit.py's readers): a
// requirements file, pip freeze or lock, and packaging's versions and specifiers as far as pins and ranges need them.
// Reading only: the judging is judge.js, over the tables Python compiled. tests/test_site_answer.py holds the page and
// audit to the same answers on the same pasted inputs.
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

  // -> {pins: {package: version}, loose: [requirement text], kind: "lock" | "requirements"}; throws on bad input
  // (user_files.read_pins: a byte-order mark is no character of the text; a text with NUL is no text; read as nothing
  // is no input).
  function readPins(text, kind) {
    text = String(text).replace(/^\ufeff/, "");
    if (text.includes("\u0000")) throw new Error("not a text (it holds NUL characters)");
    kind = kind || (looksLikeLock(text) ? "lock" : "requirements");
    const read = kind === "lock" ? { pins: lockPins(text), loose: [], kind } : Object.assign(requirementPins(text), { kind });
    if (!Object.keys(read.pins).length && !read.loose.length) throw new Error("read as nothing: no requirement and no locked package in it");
    return read;
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

  // user_files._DIRECT: a requirement that names no release to look up (a URL or a path).
  const DIRECT = /^(git\+|hg\+|svn\+|bzr\+|https?:\/\/|file:|\.{1,2}\/|\/|[A-Za-z]:[\\/])/;

  function requirementPins(text) {
    const pins = {}, loose = [];
    text.split(/\r\n|\n|\r/).forEach((raw, index) => {
      const line = raw.split(/\s+#/, 1)[0].trim();
      if (!line || line.startsWith("#")) return;
      if (/^(-r|--requirement|-c|--constraint)\b/.test(line)) {
        throw new Error(`line ${index + 1}: ${JSON.stringify(line)} includes another file: paste that file too`);
      }
      if (line.startsWith("-")) return;  // options: -e, --index-url, --hash continuations
      if (line.includes(" @ ") || DIRECT.test(line)) { loose.push(line); return; }
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

  const api = { readPins, looseRanges, releaseKey, cmpRelease, setContains, parseRequirement, canonicalName };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.CompatRead = api;
})(typeof window !== "undefined" ? window : this);
