"""Plain-text tables for terminals and notebook stream output, with no dependencies (the GPU path prints
them too; the notebooks' Markdown tables use DataFrame.to_markdown instead).

    print(text_table(["policy", "ms"], [["eager", "1.5"]], right_from=1))
"""


def text_table(head, rows, *, right_from: int | None = None) -> str:
    """Columns padded to their widest cell, a dashed rule under the header; columns from `right_from` on
    are right-aligned (numbers), the others left-aligned."""
    head = [str(x) for x in head]
    rows = [[str(x) for x in row] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def line(row):
        cells = (x.rjust(w) if right_from is not None and i >= right_from else x.ljust(w)
                 for i, (x, w) in enumerate(zip(row, widths)))
        return "  ".join(cells)

    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])
