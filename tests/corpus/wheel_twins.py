"""Broken twins of kernels read from a library's wheel (vLLM's, SGLang's fused MoE, unsloth's grouped GEMM), shared
by their tests.

A twin is the wheel's own kernel with one line of one function edited: a stand-in wheel holding the edited
source (:func:`edited_wheel`), pointed at through the adapter's wheel variable. :func:`rejected` runs the
harness on it and returns the failure's message, having checked that the failure names its routing.
"""

from __future__ import annotations

import zipfile

import pytest

import gmm_ref

#: a routed failure's first words: the token, the slot and the expert (global, then local) of a wrong element
SLOT = r"token \d+, slot \d+ \(expert \d+, local -?\d+"


def edited_wheel(wheel: str, member: str, function: str, old: str, new: str, path, also: tuple[str, ...] = ()) -> str:
    """A wheel at ``path`` holding ``wheel``'s ``member`` with ``old`` (which occurs once in the body of the
    top-level ``function``) replaced by ``new`` there, and ``wheel``'s members ``also`` as they are."""
    with zipfile.ZipFile(wheel) as z:
        text = z.read(member).decode()
        kept = {name: z.read(name) for name in also}
    start = text.index(f"\ndef {function}(")
    end = text.find("\ndef ", start + 1)
    end = len(text) if end < 0 else end  # the file's last function
    body = text[start:end]
    assert body.count(old) == 1, old
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, text[:start] + body.replace(old, new) + text[end:])
        for name, data in kept.items():
            z.writestr(name, data)
    return str(path)


def rejected(kernel, max_examples: int | None = None) -> str:
    """The message of the harness's failure on ``kernel`` (the normal mode, the ``gmm-ci`` profile, at most
    ``max_examples`` routings), which must name the routing it was drawn on."""
    from property_tests.checks.check import check_kernel

    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(kernel, modes=["normal"], profile="gmm-ci", max_examples=max_examples)
    assert "Routing: T=" in "\n".join(getattr(info.value, "__notes__", [])), "the failure names its routing"
    return str(info.value)
