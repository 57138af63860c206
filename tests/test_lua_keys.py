"""Every key a Lua script touches is declared in KEYS: no script builds a key name from strings.

Servers that check declared keys (Dragonfly, and cluster proxies of managed services) refuse a
script that touches an undeclared key; Redis Cluster only notices when the slot differs. So this
scans every script as sent to the server (``delayq.lua.source``: prelude included) and follows
each key argument of every ``redis.call``/``redis.pcall`` back to where it comes from: it must
be ``KEYS[...]``, or a local (variable, table element, loop variable, function parameter or
function result) that only ever holds such values. A string literal, a concatenation, ARGV or
anything computed is refused. Commands must be literal names whose key positions the test knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from delayq import lua

# argument positions (1-based, after the command name) that are keys; "all": every argument
KEY_POSITIONS: dict[str, tuple[int, ...] | str] = {
    **{c: (1,) for c in (
        "GET SET PEXPIRE PTTL TYPE HGET HSET HDEL HEXISTS HMGET HKEYS HLEN HGETALL HINCRBY "
        "ZADD ZREM ZSCORE ZRANGE ZCARD ZCOUNT ZRANGEBYSCORE ZREVRANGEBYSCORE ZREMRANGEBYSCORE "
        "ZPOPMIN RPOP LPUSH LLEN LINDEX SADD SREM SMEMBERS SISMEMBER SCARD RPUSH LPOP LRANGE "
        "LREM LTRIM INCR INCRBY EXPIRE PEXPIREAT PERSIST ZINCRBY ZREVRANGE ZRANK ZMSCORE HSCAN "
        "ZRANGEBYLEX ZLEXCOUNT"
    ).split()},
    "DEL": "all", "EXISTS": "all", "UNLINK": "all", "MGET": "all",
    # no key: the server's clock; a pub/sub channel (not a key, not slot-bound on a cluster)
    "TIME": (), "PUBLISH": (),
}  # fmt: skip

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|--[^\n]*)
    |(?P<long>\[(?P<leq>=*)\[.*?\](?P=leq)\])
    |(?P<str>'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")
    |(?P<num>0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op>\.\.\.|\.\.|==|~=|<=|>=|//|::|[-+*/%^#<>=(){}\[\];:,.])""",
    re.S | re.X,
)
_BINARY = {"+", "-", "*", "/", "//", "%", "^", "..", "==", "~=", "<", "<=", ">", ">=", "and", "or"}
_OPERAND_END = {")", "]", "}"}
_KEYWORDS = {
    "local", "function", "if", "then", "else", "elseif", "end", "for", "while", "do", "repeat",
    "until", "return", "break", "in", "not", "and", "or", "nil", "true", "false", "goto",
}  # fmt: skip


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    line: int


def tokenize(source: str) -> list[Tok]:
    out, pos, line = [], 0, 1
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        assert m, f"cannot tokenize line {line}: {source[pos : pos + 40]!r}"
        kind = m.lastgroup or ""
        kind = {"ceq": "comment", "leq": "long"}.get(kind, kind)
        if kind not in ("ws", "comment"):
            out.append(Tok("str" if kind == "long" else kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return out


Expr = tuple[Tok, ...]


def _operand_end(tok: Tok) -> bool:
    if tok.kind in ("num", "str"):
        return True
    if tok.kind == "name":
        return tok.text not in _KEYWORDS or tok.text in ("nil", "true", "false")
    return tok.text in _OPERAND_END or tok.text == "..."


def matching(toks: list[Tok], i: int) -> int:
    """Index of the bracket closing the one at ``i``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text in pairs and toks[j].kind == "op":
            depth += 1
        elif toks[j].text in pairs.values() and toks[j].kind == "op":
            depth -= 1
            if depth == 0:
                return j
    raise AssertionError(f"unbalanced {toks[i].text!r} at line {toks[i].line}")


def split_commas(toks: list[Tok] | Expr) -> list[Expr]:
    parts: list[Expr] = []
    depth, start = 0, 0
    for j, t in enumerate(toks):
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
        elif t.text == "," and depth == 0:
            parts.append(tuple(toks[start:j]))
            start = j + 1
    if start < len(toks):
        parts.append(tuple(toks[start:]))
    return parts


def read_explist(toks: list[Tok], i: int) -> tuple[list[Expr], int]:
    """The expression list starting at ``i`` (after ``=`` or ``return``); and where it ends."""
    j, expect_operand = i, True
    while j < len(toks):
        t = toks[j]
        if t.kind == "eof":
            break
        if expect_operand:
            if t.kind == "op" and t.text in "([{":
                j = matching(toks, j) + 1
                expect_operand = False
                continue
            if t.kind == "name" and t.text == "function":
                raise AssertionError(f"anonymous function at line {t.line}: teach the test")
            if t.text in ("-", "not", "#"):
                j += 1
                continue
            if t.kind == "name" and t.text in _KEYWORDS and not _operand_end(t):
                break  # `return end`, `return` alone
            j += 1
            expect_operand = False
            continue
        if t.kind == "op" and t.text in "([":
            j = matching(toks, j) + 1
            continue
        if t.kind == "op" and t.text in (".", ":"):
            j += 2
            continue
        if t.kind == "str":  # f'x' call
            j += 1
            continue
        if t.text in _BINARY or t.text == ",":
            j += 1
            expect_operand = True
            continue
        break
    return split_commas(toks[i:j]), j


@dataclass
class Script:
    name: str
    toks: list[Tok]
    assigns: dict[str, list[Expr | None]] = field(default_factory=dict)  # None: not a key
    elems: dict[str, list[Expr]] = field(default_factory=dict)  # t[i] = e, {e, ...}
    loop_of: dict[str, list[Expr]] = field(default_factory=dict)  # for _, v in ipairs(e)
    params: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    returns: dict[str, list[Expr]] = field(default_factory=dict)
    calls: dict[str, list[list[Expr]]] = field(default_factory=dict)
    uses: list[tuple[str, int, Expr]] = field(default_factory=list)  # command, line, key arg
    commands: int = 0  # redis.call / redis.pcall seen


def analyse(name: str, source: str) -> Script:
    toks = [*tokenize(source), *[Tok("eof", "", 0)] * 4]
    s = Script(name, toks)
    funcs: list[tuple[str, int, int]] = []  # name, body start, body end
    brace = 0
    i = 0
    while toks[i].kind != "eof":
        t = toks[i]
        prev = toks[i - 1].text if i else ""
        if t.kind == "op" and t.text == "{":
            brace += 1
        elif t.kind == "op" and t.text == "}":
            brace -= 1
        if t.text == "function" and t.kind == "name" and toks[i + 1].kind == "name":
            fname = toks[i + 1].text
            assert toks[i + 2].text == "(", f"{name}: function {fname} at line {t.line}"
            close = matching(toks, i + 2)
            for k, p in enumerate(split_commas(toks[i + 3 : close])):
                s.params.setdefault(p[0].text, []).append((fname, k))
            funcs.append((fname, close + 1, _block_end(toks, close + 1)))
            i = close + 1
            continue
        if t.text == "local" and toks[i + 1].kind == "name" and toks[i + 1].text != "function":
            j, names = i + 1, []
            while True:
                names.append(toks[j].text)
                if toks[j + 1].text != ",":
                    break
                j += 2
            if toks[j + 1].text == "=":
                exprs, end = read_explist(toks, j + 2)
                _bind(s, names, exprs)
                i = end
                continue
            for n in names:
                s.assigns.setdefault(n, []).append(())  # nil
            i = j + 1
            continue
        if t.text == "for" and t.kind == "name":
            if toks[i + 2].text == "=":
                s.assigns.setdefault(toks[i + 1].text, []).append(None)
            else:
                names, j = [toks[i + 1].text], i + 2
                while toks[j].text == ",":
                    names.append(toks[j + 1].text)
                    j += 2
                assert toks[j].text == "in", f"{name}: for at line {t.line}"
                it = toks[j + 1].text
                assert it in ("ipairs", "pairs") and toks[j + 2].text == "(", (
                    f"{name}: loop over {it} at line {t.line}: teach the test"
                )
                close = matching(toks, j + 2)
                s.assigns.setdefault(names[0], []).append(None)  # index / table key
                for n in names[1:]:
                    s.loop_of.setdefault(n, []).append(tuple(toks[j + 3 : close]))
            i += 1
            continue
        if (
            t.kind == "name"
            and t.text not in _KEYWORDS
            and brace == 0
            and prev not in (".", ":", "local", "function", "for")
        ):
            # a, b = ...   /   t[...] = ...   /   f(...)
            j, names = i, [t.text]
            while toks[j + 1].text == "," and toks[j + 2].kind == "name":
                j += 2
                names.append(toks[j].text)
            if toks[j + 1].text == "=" and prev not in (",",):
                exprs, end = read_explist(toks, j + 2)
                _bind(s, names, exprs)
                i = end
                continue
            if toks[i + 1].text == "[" and len(names) == 1:
                close = matching(toks, i + 1)
                if toks[close + 1].text == "=":
                    exprs, end = read_explist(toks, close + 2)
                    s.elems.setdefault(t.text, []).extend(exprs[:1])
                    i = end
                    continue
        i += 1
    # calls of local functions and of redis, wherever they are (in expressions too)
    names = {f[0] for f in funcs}
    for i, t in enumerate(toks[:-1]):
        prev = toks[i - 1].text if i else ""
        if t.kind != "name" or prev in (".", ":", "function"):
            continue
        if t.text == "redis" and toks[i + 1].text == "." and toks[i + 2].text in ("call", "pcall"):
            close = matching(toks, i + 3)
            _use(s, split_commas(toks[i + 4 : close]), t.line)
        elif t.text in names and toks[i + 1].text == "(":
            close = matching(toks, i + 1)
            s.calls.setdefault(t.text, []).append(split_commas(toks[i + 2 : close]))
    for fname, start, end in funcs:
        k = start
        while k < end:
            if toks[k].text == "return":
                exprs, k2 = read_explist(toks, k + 1)
                s.returns.setdefault(fname, []).extend(exprs[:1])
                k = max(k2, k + 1)
            else:
                k += 1
    return s


def _block_end(toks: list[Tok], i: int) -> int:
    depth = 1
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind != "name":
            continue
        if t.text in ("function", "if", "do", "repeat"):
            depth += 1
        elif t.text in ("end", "until"):
            depth -= 1
            if depth == 0:
                return j
    raise AssertionError("unterminated block")


def _bind(s: Script, names: list[str], exprs: list[Expr]) -> None:
    for k, n in enumerate(names):
        # past the last expression: more values of a call, not followed here
        e = exprs[k] if k < len(exprs) else None
        s.assigns.setdefault(n, []).append(e)
        if e and e[0].text == "{":
            for item in split_commas(e[1:-1]):
                if any(t.text == "=" for t in item):
                    continue  # {name = value}: a record, not a list of keys
                s.elems.setdefault(n, []).append(item)


def _use(s: Script, args: list[Expr], line: int) -> None:
    assert args and args[0] and args[0][0].kind == "str" and len(args[0]) == 1, (
        f"{s.name}: line {line}: redis.call with a command that is not a literal name"
    )
    s.commands += 1
    command = args[0][0].text.strip("'\"").upper()
    assert command in KEY_POSITIONS, (
        f"{s.name}: line {line}: {command}: add its key positions to KEY_POSITIONS"
    )
    spec = KEY_POSITIONS[command]
    positions = range(1, len(args)) if spec == "all" else spec
    for p in positions:
        assert p < len(args), f"{s.name}: line {line}: {command} without its key"
        s.uses.append((command, line, args[p]))


class KeyCheck:
    def __init__(self, s: Script) -> None:
        self.s = s
        self.busy: set[tuple[str, str]] = set()

    def text(self, e: Expr) -> str:
        return " ".join(t.text for t in e)

    def is_key(self, e: Expr, *, absent_ok: bool = False) -> bool:
        if not e:
            return absent_ok
        parts = _split_word(e, "or")
        if len(parts) > 1:
            return all(self.is_key(p, absent_ok=True) for p in parts)
        parts = _split_word(e, "and")
        if len(parts) > 1:  # `cond and x`: x (or false, which `or` then replaces)
            return self.is_key(parts[-1], absent_ok=True)
        if e[0].text == "(" and matching(list(e), 0) == len(e) - 1:
            return self.is_key(e[1:-1], absent_ok=absent_ok)
        if len(e) == 1 and e[0].text == "nil":
            return absent_ok
        if (
            e[0].text == "KEYS"
            and len(e) > 1
            and e[1].text == "["
            and matching(list(e), 1) == len(e) - 1
        ):
            return True
        if len(e) == 1 and e[0].kind == "name":
            return self.name_is_key(e[0].text, absent_ok)
        if e[0].kind == "name" and len(e) > 1 and matching(list(e), 1) == len(e) - 1:
            if e[1].text == "(":  # a local function's result
                returns = self.s.returns.get(e[0].text)
                return bool(returns) and all(self.guard(("ret", e[0].text), r) for r in returns)
            if e[1].text == "[":  # an element of a local table
                return self.table_is_keys(e[0].text)
        return False

    def guard(self, mark: tuple[str, str], e: Expr, absent_ok: bool = False) -> bool:
        if mark in self.busy:
            return True  # a cycle: decided by the other paths
        self.busy.add(mark)
        try:
            return self.is_key(e, absent_ok=absent_ok)
        finally:
            self.busy.discard(mark)

    def name_is_key(self, name: str, absent_ok: bool) -> bool:
        s = self.s
        sources: list[bool] = []
        for fname, k in s.params.get(name, []):
            if not s.calls.get(fname):
                sources.append(True)  # never called in this script: never used
            for args in s.calls.get(fname, []):
                arg = args[k] if k < len(args) else ()
                sources.append(self.guard(("param", f"{name}:{self.text(arg)}"), arg, True))
        for it in s.loop_of.get(name, []):
            sources.append(len(it) == 1 and it[0].kind == "name" and self.table_is_keys(it[0].text))
        for e in s.assigns.get(name, []):
            if e is None:
                sources.append(False)
            elif e == ():
                sources.append(absent_ok)
            elif e[0].text == "{":
                sources.append(False)  # a table used as a key
            else:
                sources.append(self.guard(("var", f"{name}={self.text(e)}"), e, absent_ok))
        return bool(sources) and all(sources)

    def table_is_keys(self, name: str) -> bool:
        """Whether every value ``name`` holds is a table of keys (or nil): built with
        ``{...}``, a local function's result, or a function parameter given such tables."""
        if name == "KEYS":
            return True
        s = self.s
        sources = [
            self.table_guard(("tvar", f"{name}={self.text(e)}"), e)
            for e in s.assigns.get(name, [])
            if e != ()
        ]
        for fname, k in s.params.get(name, []):
            for args in s.calls.get(fname, []):
                arg = args[k] if k < len(args) else ()
                sources.append(self.table_guard(("tparam", f"{name}:{self.text(arg)}"), arg))
        if not sources or not all(sources):
            return False
        elems = s.elems.get(name, [])
        return all(self.guard(("elem", f"{name}:{self.text(e)}"), e) for e in elems)

    def table_guard(self, mark: tuple[str, str], e: Expr | None) -> bool:
        if mark in self.busy:
            return True  # a cycle: decided by the other paths
        self.busy.add(mark)
        try:
            return self.table_expr_is_keys(e)
        finally:
            self.busy.discard(mark)

    def table_expr_is_keys(self, e: Expr | None) -> bool:
        """Whether expression ``e`` gives a table of keys, or nil."""
        if e is None:
            return False
        if not e or (len(e) == 1 and e[0].text == "nil"):
            return True
        parts = _split_word(e, "or")
        if len(parts) > 1:
            return all(self.table_expr_is_keys(p) for p in parts)
        parts = _split_word(e, "and")
        if len(parts) > 1:  # `cond and t`: t (or false, which `or` then replaces)
            return self.table_expr_is_keys(parts[-1])
        if e[0].text == "{" and matching(list(e), 0) == len(e) - 1:
            items = [i for i in split_commas(e[1:-1]) if not any(t.text == "=" for t in i)]
            return all(self.is_key(i) for i in items)
        if len(e) == 1 and e[0].kind == "name":
            return self.table_is_keys(e[0].text)
        if e[0].kind == "name" and len(e) > 1 and e[1].text == "(":
            if matching(list(e), 1) != len(e) - 1:
                return False
            returns = self.s.returns.get(e[0].text)
            return bool(returns) and all(self.table_guard(("tret", e[0].text), r) for r in returns)
        return False


def _split_word(e: Expr, word: str) -> list[Expr]:
    parts, depth, start = [], 0, 0
    for j, t in enumerate(e):
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
        elif depth == 0 and t.kind == "name" and t.text == word:
            parts.append(e[start:j])
            start = j + 1
    parts.append(e[start:])
    return parts


SCRIPTS = (*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE)


def test_every_lua_file_is_a_known_script() -> None:
    files = {p.stem for p in Path(lua.__file__).parent.glob("*.lua") if not p.stem.startswith("_")}
    assert files == set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_key_comes_from_keys(name: str) -> None:
    s = analyse(name, lua.source(name))
    check = KeyCheck(s)
    source = lua.source(name)
    code = re.sub(r"--[^\n]*", "", source)  # comments may name redis.call too
    assert s.commands == len(re.findall(r"redis\.p?call\(", code)), "the scan missed calls"
    bad = [
        f"line {line}: {command} {check.text(arg)}"
        for command, line, arg in s.uses
        if not check.is_key(arg)
    ]
    assert not bad, f"{name}: keys not (only) from KEYS:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "body",
    [
        "redis.call('GET', 'k')",
        "redis.call('GET', KEYS[1] .. ':x')",
        "local k = ARGV[1]\nredis.call('HSET', k, 'f', 1)",
        "local p = KEYS[1]\nlocal k = p .. ':ready'\nredis.call('LPUSH', k, 1)",
        "local function f(k) return redis.call('GET', k) end\nf(KEYS[1])\nf('x')",
        "local t = {KEYS[1]}\nt[2] = 'other'\nfor _, k in ipairs(t) do redis.call('DEL', k) end",
        "redis.call(ARGV[1], KEYS[1])",
        "redis.call('DEL', KEYS[1], string.format('%s', ARGV[1]))",
        # tables of keys handed on: from a function, and through a parameter
        "local function ls() return {KEYS[1], 'x'} end\nlocal t = ls()\nredis.call('DEL', t[2])",
        "local function f(ks) redis.call('DEL', ks[1]) end\nf({KEYS[1]})\nf({ARGV[1]})",
        "local t = {KEYS[1]}\nt = {ARGV[1]}\nredis.call('DEL', t[1])",
    ],
)
def test_the_scan_catches_built_keys(body: str) -> None:
    try:
        s = analyse("probe", body)
        check = KeyCheck(s)
        bad = [arg for _, _, arg in s.uses if not check.is_key(arg)]
    except AssertionError:
        return  # refused outright (a command that is not a literal name)
    assert bad, body


def test_the_scan_accepts_keys_passed_along() -> None:
    body = (
        "local K_A, K_B = KEYS[1], KEYS[2]\n"
        "local function gk(i) return KEYS[2 + i] end\n"
        "local function f(k, other) redis.call('ZADD', k or K_A, 1, 'm') end\n"
        "f(K_B)\nf(nil)\nf(gk(1), 3)\n"
        "local t = {K_A}\nt[2] = gk(2)\nfor _, k in ipairs(t) do redis.call('DEL', k) end\n"
        "local function ls() if K_B then return {K_A, K_B} end return nil end\n"
        "local L = ls()\nlocal function g(ks, n) redis.call('LLEN', n == 0 and K_A or ks[n]) end\n"
        "g(L, 1)\n"
    )
    s = analyse("probe", body)
    check = KeyCheck(s)
    assert len(s.uses) == 3
    assert all(check.is_key(arg) for _, _, arg in s.uses)
