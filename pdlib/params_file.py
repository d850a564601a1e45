"""A params file's YAML, read the same way for `run`, `validate`, `sweep` and `serve`: a regular file of UTF-8
text (a FIFO would block, /dev/zero never end), at most MAX_BYTES, each mapping's keys once (YAML's last-wins
would let a second `trials:` silently replace the first). Every failure is one InputError line naming the file.

    data = read_yaml("params/smoke-cpu.yaml")   # whatever the YAML holds: the caller checks its shape
"""

import os
import stat

from pdlib.errors import InputError

MAX_BYTES = 1 << 20  # a params file is a few dozen lines


def _loader():
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    break
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice", key_node.start_mark
                    )
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def read_yaml(path):
    """The YAML in `path` (module docstring); InputError, one line, when it cannot be read as a params file."""
    import yaml

    where = f"params file {str(path)!r}"
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InputError(f"cannot read {where}: not a regular file")
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read {where}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise InputError(f"cannot read {where}: larger than {MAX_BYTES} bytes, not a params file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where} is not UTF-8 text ({e.reason})") from None
    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)  # a syntax error's first line only says what it was reading
        ok = mark is not None and getattr(e, "problem", None)
        why = f"{e.problem} at line {mark.line + 1}, column {mark.column + 1}" if ok else str(e).splitlines()[0]
        raise InputError(f"cannot read {where}: {why}") from None
    except RecursionError:
        raise InputError(f"cannot read {where}: its values nest too deeply") from None
