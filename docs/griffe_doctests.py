"""A griffe extension for the API pages (`mkdocs.yml`): the `>>>` examples of a
docstring shown as Python console blocks. Written plainly in a docstring (where
`doctest` runs them), markdown would read `>>>` as nested quotes and `[1.0, 0.0]` in
an output as a link."""

import griffe


def fence_doctests(text: str) -> str:
    """`text` with every run of `>>>` lines and their outputs (up to a blank line)
    inside a ```pycon fence; text already inside a fence is left alone."""
    out, block, fenced = [], [], False

    def flush():
        if block:
            out.extend(["```pycon", *block, "```"])
            block.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif not fenced and (line.lstrip().startswith(">>>") or (block and line.strip())):
            block.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
