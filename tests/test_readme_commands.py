"""Every command README.md shows runs in the suite, so that a moved file or a renamed flag fails CI.

The commands are read from README.md's code blocks (fenced or indented): ``bash run.sh JOB ...``, ``causal-qwen ...``
(also ``.venv/bin/causal-qwen`` and ``bash run.sh cli ...``) and ``python benchmarks/...`` / ``python scripts/...``
(any python). Each command is

* parsed: a ``causal-qwen`` command by the command line's own parser, a script's flags against the options its
  source declares, and every repository path it names must exist;
* covered: run here in a quick form (`RUN_HERE`), or mapped in `RUN_ELSEWHERE` to the test that runs it, whose
  source must name the command and each of its flags. A README command in neither table fails, and so does a table
  entry that no README command uses.

A command's key is its program, its subcommand (or script) and the flags it uses, sorted; the flags that choose a
behaviour (`VALUED_FLAGS`) carry their value. ``--model`` and ``--base`` both only say where the model comes from;
the loading tests cover each.

docs/benchmarks.md's commands are checked the cheap way (paths exist, flags declared), not for coverage.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BENCHMARKS_DOC = REPO / "docs" / "benchmarks.md"
VALUED_FLAGS = ("--mode", "--individual-scope")
MODEL_SOURCE = ("--model", "--base")
REPO_FOLDERS = ("benchmarks", "causal_qwen", "docs", "examples", "scripts", "tests")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

# README command key -> the test that runs it (its source names the subcommand or script and every flag).
DEMO_TEST = "tests/test_demo.py::test_quick_demo_writes_report_and_plots"
GENERATE_TEST = "tests/test_text_generation.py::test_cli_json_equals_generate"
REPLAY_TEST = "tests/test_generation.py::test_cli_generate_json_and_individual_replay"
RUN_ELSEWHERE = {
    "run.sh demo": DEMO_TEST,
    "causal-qwen demo --base --out": "tests/test_demo.py::test_quick_demo_on_a_pretrained_base_writes_sentences_in_every_mode",
    "causal-qwen convert --base --out": "tests/test_compare.py::test_convert_cli_writes_loadable_folder",
    "causal-qwen generate --max-new-tokens --mode=standard --model": GENERATE_TEST,
    "causal-qwen generate --max-new-tokens --mode=traditional --model --temperature": GENERATE_TEST,
    "causal-qwen generate --max-new-tokens --mode=causal --model --seed": GENERATE_TEST,
    "causal-qwen generate --mode=causal --model --seed": GENERATE_TEST,
    "causal-qwen generate --chat --max-new-tokens --model":
        "tests/test_text_generation.py::test_cli_chat_sends_each_prompt_through_the_chat_template",
    "causal-qwen generate --individual-scope=sequence --mode=causal --model --save-individual --seed": REPLAY_TEST,
    "causal-qwen generate --individual --individual-scope=sequence --mode=causal --model": REPLAY_TEST,
    "causal-qwen predict --model --top-k": "tests/test_generation.py::test_cli_predict",
    "causal-qwen train": "tests/test_training.py::test_two_gloo_processes_match_one_process",
    "causal-qwen train --resume": "tests/test_robustness.py::test_cli_killed_during_a_checkpoint_write_resumes_and_says_which",
    "causal-qwen eval --model": "tests/test_robustness.py::test_eval_reads_the_runs_config_and_scores_the_target",
    "python benchmarks/ovr_head.py --json": "tests/test_ovr_head_benchmark.py::test_smoke_run_measures_every_part",
}
# README command key -> how this module runs it (see `test_commands_run_here`).
RUN_HERE = {
    "run.sh test": "ci",  # the suite itself: .ci/run must run this command
    "python scripts/fetch_real_qwen.py": "help",  # a real run downloads 491 MB
}


@dataclass(frozen=True)
class Command:
    line: str  # as the document shows it, comment dropped
    program: str  # "causal-qwen", "run.sh" or "python"
    argv: tuple[str, ...]  # after the program: subcommand / job / script first

    @property
    def target(self) -> str:
        """The subcommand, job or script (with plot's kind)."""
        if self.program == "causal-qwen" and self.argv[:1] == ("plot",) and len(self.argv) > 1:
            return "plot " + self.argv[1]
        return self.argv[0] if self.argv else ""

    def flags(self) -> list[str]:
        return sorted(set(FLAG.findall(" ".join(self.argv[1:]))))

    @property
    def key(self) -> str:
        shown = []
        for flag in self.flags():
            if flag in VALUED_FLAGS and flag in self.argv:
                shown.append(f"{flag}={self.argv[self.argv.index(flag) + 1]}")
            else:
                shown.append(flag)
        return " ".join([self.program, self.target, *shown])


def code_lines(text: str) -> list[str]:
    """The lines of the document's code blocks other than yaml and python: fenced blocks, and indented blocks
    (four spaces after a blank line, outside lists and fences); a trailing backslash joins the next line."""
    lines, fenced, language, indented, previous_blank = [], False, "", False, True
    for raw in text.splitlines():
        if raw.lstrip().startswith("```") and not raw.startswith("    "):
            fenced, language = not fenced, raw.strip().strip("`").strip()
            continue
        if fenced:
            if language not in ("yaml", "python"):
                lines.append(raw)
            continue
        if raw.startswith("    ") and (indented or previous_blank):
            indented = True
            lines.append(raw[4:])
        elif raw.strip():
            indented = False
        previous_blank = not raw.strip()
    joined: list[str] = []
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        else:
            joined.append(line)
    return joined


def parse_command(line: str) -> Command | None:
    """A project command, or None for anything else (program output, other tools)."""
    try:
        words = shlex.split(line.strip().removeprefix("$ "), comments=True)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # OMP_NUM_THREADS=1 ...
        words = words[1:]
    if not words:
        return None
    shown = " ".join(shlex.quote(word) for word in words)
    program, rest = Path(words[0]).name, words[1:]
    if program == "bash" and rest[:1] == ["run.sh"]:
        if rest[1:2] == ["cli"]:
            return Command(shown, "causal-qwen", tuple(rest[2:]))
        return Command(shown, "run.sh", tuple(rest[1:]))
    if program == "causal-qwen":
        return Command(shown, "causal-qwen", tuple(rest))
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and rest:
        if rest[:2] == ["-m", "causal_qwen.cli"]:
            return Command(shown, "causal-qwen", tuple(rest[2:]))
        if rest[0].endswith(".py"):
            return Command(shown, "python", tuple(rest))
    return None


def commands_in(path: Path) -> list[Command]:
    return [command for line in code_lines(path.read_text(encoding="utf-8"))
            if (command := parse_command(line)) is not None]


README_COMMANDS = commands_in(README)


def test_the_readme_shows_the_commands_this_module_knows():
    """The extraction itself: the README's two set-up-and-run commands and its causal-qwen commands are found."""
    jobs = {command.target for command in README_COMMANDS if command.program == "run.sh"}
    assert jobs == {"demo", "test"}, f"exactly two set-up-and-run commands (the demo and the tests), found {jobs}"
    assert any(command.program == "causal-qwen" for command in README_COMMANDS)
    assert not (REPO / "README.md").read_text().count("\t"), "no tabs: indented code blocks are four spaces"


# ---- coverage --------------------------------------------------------------------------------------------------
def test_every_readme_command_runs_in_the_suite():
    missing = [f"{command.line}\n    key: {command.key!r}" for command in README_COMMANDS
               if command.key not in RUN_ELSEWHERE and command.key not in RUN_HERE]
    assert not missing, ("README commands that no test runs: run them quickly in RUN_HERE or map them to the test "
                         "that runs them in RUN_ELSEWHERE (tests/test_readme_commands.py):\n" + "\n".join(missing))
    keys = {command.key for command in README_COMMANDS}
    stale = sorted((set(RUN_ELSEWHERE) | set(RUN_HERE)) - keys)
    assert not stale, f"entries no README command uses any more: {stale}"


def source_of(node_id: str) -> tuple[str, str]:
    """(the whole test module, the test function with its decorators) of ``tests/x.py::name``."""
    file, name = node_id.split("::")
    module = (REPO / file).read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(module)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            return module, "\n".join(module.splitlines()[first - 1:node.end_lineno])
    raise AssertionError(f"{node_id}: no such test")


@pytest.mark.parametrize("key", sorted(RUN_ELSEWHERE))
def test_the_mapped_test_runs_that_command(key):
    node_id = RUN_ELSEWHERE[key]
    assert node_id.split("::")[1].startswith("test_"), node_id
    module, function = source_of(node_id)
    program, target, *flags = key.split(" ")
    if program == "python":
        assert Path(target).name in module, f"{node_id} does not run {target}"
    else:
        assert all(f'"{word}"' in function for word in target.split()), f"{node_id} does not run {program} {target}"
    for flag in flags:
        name, _, value = flag.partition("=")
        if name in MODEL_SOURCE:
            assert any(f'"{source}"' in function for source in MODEL_SOURCE), f"{node_id} loads no model by flag"
            continue
        assert f'"{name}"' in function, f"{node_id} never passes {name} (README: {key})"
        if value:
            assert f'"{value}"' in function, f"{node_id} never passes {name} {value} (README: {key})"


def test_commands_run_here(tmp_path):
    for command in README_COMMANDS:
        how = RUN_HERE.get(command.key)
        if how == "ci":
            ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
            assert ci[-1] == "bash run.sh test -q", f".ci/run should run the README's test command: {ci[-1]!r}"
            assert command.line == "bash run.sh test", command.line
            run_sh = (REPO / "run.sh").read_text(encoding="utf-8")
            assert re.search(r'^\s*test\) exec "\$PY" -m pytest "\$@" ;;$', run_sh, re.M), "run.sh test runs pytest"
        elif how == "help":
            script = REPO / command.argv[0]
            done = subprocess.run([sys.executable, str(script), "--help"], cwd=REPO, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            for flag in command.flags():
                assert flag in done.stdout, f"{command.line}: {flag} is not in its --help"
        else:
            assert command.key in RUN_ELSEWHERE, command.key


# ---- every command names real files and real flags -------------------------------------------------------------
def declared_flags(script: Path) -> set[str]:
    """The options a script's argparse parser declares (read from its source, without running it)."""
    source = script.read_text(encoding="utf-8")
    return {flag for call in re.findall(r"add_argument\(([^)]*)", source) for flag in FLAG.findall(call)} | {"--help"}


def check_command(command: Command) -> None:
    for word in command.argv:
        if "/" in word and word.split("/")[0] in REPO_FOLDERS:
            assert (REPO / word).exists(), f"{command.line}: {word} does not exist"
    if command.program == "causal-qwen":
        from causal_qwen.cli import build_parser

        try:
            build_parser().parse_args(list(command.argv))
        except SystemExit as stopped:
            raise AssertionError(f"causal-qwen does not accept: {command.line}") from stopped
    elif command.program == "python":
        unknown = set(command.flags()) - declared_flags(REPO / command.argv[0])
        assert not unknown, f"{command.line}: {command.argv[0]} declares no {sorted(unknown)}"
    elif command.program == "run.sh":
        assert command.target in ("demo", "test", "cli"), command.line
        if command.target == "demo":
            check_command(Command(command.line, "causal-qwen", command.argv))


@pytest.mark.parametrize("command", README_COMMANDS, ids=lambda command: command.key)
def test_readme_command_names_real_files_and_flags(command):
    check_command(command)


def test_benchmark_document_commands_name_real_files_and_flags():
    commands = commands_in(BENCHMARKS_DOC)
    scripts = {command.argv[0] for command in commands if command.program == "python"}
    documented = {f"benchmarks/{path.name}" for path in (REPO / "benchmarks").glob("*.py")}
    assert documented <= scripts, f"benchmarks without a command in docs/benchmarks.md: {sorted(documented - scripts)}"
    for command in commands:
        check_command(command)


def test_run_sh_cli_runs_in_the_callers_directory(tmp_path):
    """``bash run.sh cli train c.yaml`` from the user's folder reads c.yaml's relative ``data`` there (the script
    itself works in the repository): the run gets as far as the data, whose template names a missing column."""
    if not (REPO / ".venv" / ".causal-qwen-installed").is_file():
        pytest.skip("run.sh has not set up .venv here (bash run.sh test does); this test would install it")
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n3,4\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text("model: random:tiny\ndata: rows.csv\ntemplate: 'a {a} b {zz}'\n", encoding="utf-8")
    done = subprocess.run(["bash", str(REPO / "run.sh"), "cli", "train", "c.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "rows.csv: row 0 (header): template field 'zz' is not a column (columns: a, b)" in done.stderr, done.stderr
    assert not (REPO / "runs" / "c").exists() and not (tmp_path / "runs").exists(), "nothing written on an error"


# ---- the README's configuration and Python ---------------------------------------------------------------------
def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(encoding="utf-8"), re.S | re.M)


def test_readme_training_config_is_valid(tmp_path):
    from causal_qwen.training.data import template_fields
    from causal_qwen.training.train_config import load_train_config

    (config_text,) = blocks("yaml")
    path = tmp_path / "my_table.yaml"
    path.write_text(config_text, encoding="utf-8")
    config = load_train_config(path)  # every key exists and every value is valid
    columns = re.search(r"# columns: (.*)", config_text).group(1).split(", ")
    assert template_fields(config.template) == columns and config.split_by in columns
    assert config.recipe == "pretrained" and config.freeze_backbone and config.uses_feature_cache()  # as the README says


def test_readme_python_names_exist():
    import causal_qwen

    (code,) = blocks("python")
    tree = ast.parse(code)
    imported = {alias.name: getattr(causal_qwen, alias.name) for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "causal_qwen" for alias in node.names}
    assert imported, "the README's Python imports from causal_qwen"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported:
            assert hasattr(imported[node.value.id], node.attr), f"{node.value.id}.{node.attr}"


def test_readme_python_runs_and_decodes_the_generated_text(capsys):
    (code,) = blocks("python")
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("['The item costs 99.99 dollars."), printed
