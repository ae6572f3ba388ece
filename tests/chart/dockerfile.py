"""A small Dockerfile reader: enough to check the project's Dockerfile and replay its install steps."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON (exec) form of the arguments, or None for the shell form."""
        try:
            value = json.loads(self.args)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None

    def flags_and_command(self) -> tuple[list[str], str]:
        """A RUN's leading flags (``--mount=...``) and its command, whitespace collapsed."""
        words = self.args.split()
        flags = []
        while words and words[0].startswith("--"):
            flags.append(words.pop(0))
        return flags, " ".join(words)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(path: Path) -> list[Stage]:
    """Stages in order; continuation lines joined, comments and parser directives dropped."""
    stages: list[Stage] = []
    logical, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if not logical:
            start = number
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, args = logical.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        logical = ""
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, args, start))
    return stages


def copy_sources(instruction: Instruction) -> tuple[list[str], str]:
    """(sources, destination) of a COPY without --from."""
    words = [w for w in shlex.split(instruction.args) if not w.startswith("--")]
    return words[:-1], words[-1]
