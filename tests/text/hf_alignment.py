"""Hugging Face's alignment rules for normalized text, written from its documentation with Python's
unicodedata, independently of atlas's C++ (which uses utf8proc). Used by the tokenizer tests to
check offsets on strings whose normalized form differs from the input.

HF's NormalizedString keeps, for every normalized character, the span of the input it came from.
A normalizer produces (character, change) pairs and HF's transform applies them in order:
  * change <= 0: the character takes the next input character's span; -n also removes the n
    input characters after that one;
  * change > 0: an inserted character; it takes the span of the input character before it
    ((0, 0) at the very start).
Unicode forms (its unicode-normalization-alignments crate): the first character of each
decomposition has change 0, the rest +1; canonical reordering carries the changes along;
composing a starter (change x) with a character (change y) leaves one character with x + y - 1.
Lowercase: Rust's char::to_lowercase, extra characters inserted. Replace: the match is removed
and the content inserted (all of it on the span of the match's last character). Prepend: on the
first character's span. Strip: removes the leading and trailing White_Space characters (as HF
tokenizers 0.22.2 does).
A token's span runs from its first byte's start to its last byte's end.
"""
import re
import unicodedata

HANGUL_S, HANGUL_L, HANGUL_V, HANGUL_T = 0xAC00, 0x1100, 0x1161, 0x11A7


def full_decomposition(c, compat):
    cp = ord(c)
    if HANGUL_S <= cp < HANGUL_S + 11172:
        s = cp - HANGUL_S
        out = [chr(HANGUL_L + s // 588), chr(HANGUL_V + (s % 588) // 28)]
        if s % 28:
            out.append(chr(HANGUL_T + s % 28))
        return out
    d = unicodedata.decomposition(c)
    if not d or (d.startswith("<") and not compat):
        return [c]
    parts = [p for p in d.split() if not p.startswith("<")]
    return [x for part in parts for x in full_decomposition(chr(int(part, 16)), compat)]


def compose_pair(a, b):
    r = unicodedata.normalize("NFC", a + b)
    return r if len(r) == 1 else None


def unicode_form_changes(text, compose, compat):
    dec = []
    for c in text:
        for k, d in enumerate(full_decomposition(c, compat)):
            dec.append([d, 1 if k else 0, unicodedata.combining(d)])
    i = 0
    while i < len(dec):  # canonical ordering of each run of marks, stable
        if dec[i][2] == 0:
            i += 1
            continue
        j = i
        while j < len(dec) and dec[j][2] != 0:
            j += 1
        dec[i:j] = sorted(dec[i:j], key=lambda x: x[2])
        i = j
    if not compose:
        return [(c, ch) for c, ch, _ in dec]
    out, composee, blocked, last = [], None, [], None
    for ch, change, cc in dec:
        if composee is None:
            if cc:
                out.append((ch, change))
            else:
                composee = (ch, change)
            continue
        if last is None or last < cc:
            r = compose_pair(composee[0], ch)
            if r is not None:
                composee = (r, composee[1] + change - 1)
                continue
        if cc == 0:
            out.append(composee)
            out += blocked
            composee, blocked, last = (ch, change), [], None
        else:
            blocked.append((ch, change))
            last = cc
    if composee is not None:
        out.append(composee)
    out += blocked
    return out


def transform(chars, items, initial_removed=0):
    """chars: [(char, span)]; items: [(char, change)] -> new [(char, span)]."""
    res, pos = [], initial_removed
    for ch, change in items:
        if change > 0:
            span = chars[pos - 1][1] if pos else (0, 0)
        else:
            span = chars[pos][1]
            pos += 1 - change
        res.append((ch, span))
    return res


WHITESPACE = set(chr(c) for c in list(range(9, 14)) + [0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B))
                 + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def apply(chars, norm):
    """One normalizer (tokenizer.json form) on [(char, span)]."""
    t = norm["type"]
    text = "".join(c for c, _ in chars)
    if t == "Sequence":
        for n in norm["normalizers"]:
            chars = apply(chars, n)
        return chars
    if t in ("NFC", "NFD", "NFKC", "NFKD"):
        return transform(chars, unicode_form_changes(text, t in ("NFC", "NFKC"), t in ("NFKC", "NFKD")))
    if t == "Lowercase":
        items = []
        for c in text:
            items += [(l, 1 if k else 0) for k, l in enumerate(c.lower())]
        return transform(chars, items)
    if t == "Replace":
        pat = norm["pattern"]
        rx = re.escape(pat["String"]) if "String" in pat else pat["Regex"]
        out, at = [], 0
        for m in re.finditer(rx, text):
            if m.end() == m.start():
                continue
            out += chars[at:m.start()]
            out += [(c, chars[m.end() - 1][1]) for c in norm["content"]]
            at = m.end()
        return out + chars[at:]
    if t == "Prepend":
        if not chars:
            return chars
        return [(c, chars[0][1]) for c in norm["prepend"]] + chars
    if t == "Strip":
        n = len(chars)
        lead = trail = 0
        if norm.get("strip_left"):
            while lead < n and chars[lead][0] in WHITESPACE:
                lead += 1
        if norm.get("strip_right"):
            while trail < n and chars[n - 1 - trail][0] in WHITESPACE:
                trail += 1
        if not lead and not trail:
            return chars
        cut = n - trail
        items = [(chars[i][0], -trail if i + 1 == cut else 0) for i in range(n) if not (i < lead or i >= cut)]
        return transform(chars, items, lead)
    raise ValueError("normalizer %s not modelled" % t)


def aligned_chars(text, normalizer):
    """The normalized text as [(char, (start, end))], spans in code points of `text`."""
    chars = [(c, (k, k + 1)) for k, c in enumerate(text)]
    return apply(chars, normalizer) if normalizer else chars


def expected_offsets(text, normalizer, token_bytes):
    """HF's code-point offsets for tokens whose bytes tile the normalized text, or an error string."""
    chars = aligned_chars(text, normalizer)
    data = "".join(c for c, _ in chars).encode("utf-8")
    if b"".join(token_bytes) != data:
        return "token bytes do not reproduce the normalized text"
    span_of_byte = []
    for c, span in chars:
        span_of_byte += [span] * len(c.encode("utf-8"))
    out, pos = [], 0
    for b in token_bytes:
        out.append([span_of_byte[pos][0], span_of_byte[pos + len(b) - 1][1]])
        pos += len(b)
    return out
