"""Megatron-Core's pipeline layout string (``parallelism.pipeline_layout``;
Megatron-Core's ``--pipeline-model-parallel-layout``, parsed there by
``megatron/core/transformer/pipeline_parallel_layer_layout.py``,
``PipelineParallelLayerLayout``).

The string lists the virtual stages in model order, separated by ``|``: piece
``k`` is virtual stage ``k = chunk x pp + stage`` (Megatron's
``layout[vpp_rank * pp + pp_rank]``), so its pp x vpp pieces say what every
chunk holds. Symbols: ``E`` the embedding, ``t`` a transformer layer, ``m`` a
multi-token-prediction layer, ``L`` the loss (output layer); ``x*N`` repeats a
symbol (``|`` included) N times, ``(...)*N`` a group; commas are cosmetic; an
empty piece is an empty chunk. As Megatron's, groups do not nest.

Megatron's rules (``validate_layer_layout``): ``E`` once, first; ``L`` once,
last; as many ``t`` as the model's layers and ``m`` as its MTP layers, every
``m`` after every ``t``. The repository runs the MTP layers after the main
head on the last stage (``workloads.mtp``), so they stand in the last piece,
with the loss (Megatron's standalone MTP stage is not modelled).
"""

from __future__ import annotations

SYMBOLS = "EtmL"  # embedding, transformer layer, MTP layer, loss
MAX_SYMBOLS = 1_000_000  # far beyond any model: a count that would exhaust memory is refused


class LayoutSyntaxError(ValueError):
    """A layout string that breaks the grammar or Megatron's rules: what is wrong."""


def parse(text: str) -> tuple[str, ...]:
    """The pieces (virtual stages in order) of a layout string, each its symbols
    unrolled.

    >>> parse("Et*3|(t*4|)*2ttL")
    ('Ettt', 'tttt', 'tttt', 'ttL')
    >>> parse("E|(tt|)*2,(t|)*4,mL")
    ('E', 'tt', 'tt', 't', 't', 't', 't', 'mL')
    """
    if not text:
        raise LayoutSyntaxError("is empty")
    return tuple(_unroll(text.replace(",", "")).split("|"))


def _unroll(text: str) -> str:
    """``text`` with every ``x*N`` and ``(...)*N`` written out."""
    out, size, i = [], 0, 0
    while i < len(text):
        c = text[i]
        if c == "(":
            close = text.find(")", i)
            if close < 0:
                raise LayoutSyntaxError(f"has an unclosed '(' at character {i + 1}")
            body = text[i + 1:close]
            if "(" in body:
                raise LayoutSyntaxError("nests parentheses, which Megatron-Core's parser "
                                        "does not unroll")
            if not body:
                raise LayoutSyntaxError("has an empty group '()'")
            count, i = _count(text, close + 1, True)
            unit = _unroll(body)
        elif c == ")":
            raise LayoutSyntaxError(f"has a ')' without its '(' at character {i + 1}")
        elif c == "*":
            raise LayoutSyntaxError(f"has a '*' that follows no symbol or group at "
                                    f"character {i + 1}")
        elif c in SYMBOLS or c == "|":
            count, i = _count(text, i + 1, False)
            unit = c
        else:
            raise LayoutSyntaxError(f"has {c!r} at character {i + 1}: {c!r} is not a "
                                    f"symbol (E, t, m, L, |, (...)*N, x*N)")
        size += len(unit) * count
        if size > MAX_SYMBOLS:
            raise LayoutSyntaxError(f"unrolls to more than {MAX_SYMBOLS:,} symbols")
        out.append(unit * count)
    return "".join(out)


def _count(text: str, i: int, required: bool) -> tuple[int, int]:
    """(the repeat ``*N`` at ``text[i]``, 1 where none and none is ``required``;
    the position after it)."""
    if i < len(text) and text[i] == "*":
        j = i + 1
        while j < len(text) and text[j] in "0123456789":
            j += 1
        if j == i + 1:
            raise LayoutSyntaxError(f"has a '*' without a count at character {i + 1}")
        return int(text[i + 1:j]), j
    if required:
        raise LayoutSyntaxError("has a group '(...)' without its '*N'")
    return 1, i


def layer_counts(text: str, pp: int, v: int, layers: int, mtp_layers: int) -> list[int]:
    """Transformer layers of each of the pp x ``v`` pieces (virtual stages), after
    Megatron's rules and the repository's MTP placement.

    >>> layer_counts("Et*3|(t*4|)*2ttL", 2, 2, 13, 0)
    [3, 4, 4, 2]
    """
    pieces = parse(text)
    if len(pieces) != pp * v:
        raise LayoutSyntaxError(f"has {len(pieces)} pieces; parallelism.pp x virtual_stages "
                                f"= {pp} x {v} = {pp * v} needs {pp * v}")
    flat = "".join(pieces)
    for symbol, name, where, at in (("E", "embedding", "begin the first piece", 0),
                                    ("L", "loss", "end the last piece", -1)):
        if flat.count(symbol) != 1:
            raise LayoutSyntaxError(f"gives the {name} ({symbol}) {flat.count(symbol)} "
                                    f"times: the {name} ({symbol}) must be given once")
        if not pieces[at] or pieces[at][at] != symbol:
            raise LayoutSyntaxError(f"places the {name} elsewhere: the {name} ({symbol}) "
                                    f"must {where}")
    for symbol, name, key, want in (("t", "transformer layers", "model.layers", layers),
                                    ("m", "MTP layers", "model.mtp_layers", mtp_layers)):
        if flat.count(symbol) != want:
            raise LayoutSyntaxError(f"has {flat.count(symbol)} {name} ({symbol}); {key} "
                                    f"is {want}")
    _check_mtp(pieces)
    return [piece.count("t") for piece in pieces]


def _check_mtp(pieces: tuple[str, ...]) -> None:
    """MTP layers only in the last piece, after its transformer layers."""
    if any("m" in piece for piece in pieces[:-1]):
        raise LayoutSyntaxError("places MTP layers before the last piece: MTP layers (m) "
                                "must stand in the last piece, with the loss (they run after "
                                "the main head on the last stage: workloads.mtp)")
    last = pieces[-1]
    if "m" in last and "t" in last[last.index("m"):]:
        raise LayoutSyntaxError("has a transformer layer after an MTP layer: MTP layers (m) "
                                "must follow every transformer layer (t)")
