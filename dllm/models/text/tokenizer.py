"""Small word-level tokenizers (for tiny models and task vocabularies) and tokenizer file I/O.

``build_word_tokenizer`` makes a ``transformers.PreTrainedTokenizerFast`` from a word list: special
tokens first (ids 0..), then the words, lower-cased input, split on whitespace and punctuation,
digits split one per token. Saved files follow the official layout (``tokenizer.json`` and a
``tokenizer_config.json`` holding ``tokenizer_class = PreTrainedTokenizerFast`` and the chat
template), so they load with ``AutoTokenizer`` on transformers 4.x and 5.x.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def build_word_tokenizer(
    words: Sequence[str],
    specials: Sequence[str],
    *,
    unk_token: str = "<unk>",
    bos_token: Optional[str] = None,
    eos_token: Optional[str] = None,
    pad_token: Optional[str] = None,
    mask_token: Optional[str] = None,
    chat_template: Optional[str] = None,
    lowercase: bool = True,
    split_digits: bool = True,
) -> Any:
    """A WordLevel tokenizer whose ids are: ``unk_token``, then ``specials`` (in order), then
    ``words`` (duplicates dropped). Named special tokens must be in ``specials``."""
    for role, tok in (("bos", bos_token), ("eos", eos_token), ("pad", pad_token), ("mask", mask_token)):
        if tok is not None and tok not in specials:
            raise ValueError(f"{role}_token {tok!r} must be one of the specials {list(specials)}")
    vocab: dict[str, int] = {}
    for tok in [unk_token, *specials, *words]:
        if tok in vocab:
            continue
        if not tok or any(ch.isspace() for ch in tok):
            raise ValueError(f"vocabulary entries must be non-empty and without whitespace, got {tok!r}")
        vocab[tok] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token=unk_token))
    if lowercase:
        core.normalizer = normalizers.Lowercase()
    splitters: list[Any] = [pre_tokenizers.Whitespace()]
    if split_digits:
        splitters.append(pre_tokenizers.Digits(individual_digits=True))
    core.pre_tokenizer = pre_tokenizers.Sequence(splitters)
    # Special tokens match verbatim (not lower-cased) before pre-tokenisation.
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [unk_token, *specials]])

    from transformers import PreTrainedTokenizerFast

    named = {bos_token, eos_token, pad_token, mask_token}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=unk_token,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        mask_token=mask_token,
        additional_special_tokens=[t for t in specials if t not in named],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def token_id(tokenizer: Any, token: str) -> Optional[int]:
    """The id of ``token`` in the tokenizer's vocabulary (added tokens included), else None.
    (``convert_tokens_to_ids`` would silently return the unknown-token id.)"""
    return tokenizer.get_vocab().get(token)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens added), with the words the tokenizer does not know
    named. When its unknown token doubles as another special token (the task vocabulary's
    ``[PAD]``: a lower-case ``a`` where only ``A`` exists), such a word would be silently
    indistinguishable from that token: ValueError. A dedicated unknown token (``<unk>`` of the tiny
    random models) is a real token the model sees: a warning names the words. A literal unknown
    token typed in the text is kept; byte-level tokenizers (LLaDA's, Dream's) never produce one."""
    unk = getattr(tokenizer, "unk_token_id", None)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=unk is not None)
    except NotImplementedError:  # slow (Python) tokenizers have no offsets
        enc = tokenizer(text, add_special_tokens=False)
    ids = list(enc["input_ids"])
    if unk is None or unk not in ids:
        return ids
    offsets = enc.get("offset_mapping")
    if offsets is None:
        words = [f"{ids.count(unk)} unnamed (a slow tokenizer gives no offsets)"]
    else:
        words = [text[s:e] for t, (s, e) in zip(ids, offsets) if t == unk and text[s:e] != tokenizer.unk_token]
        if not words:
            return ids
    roles = [r for r in ("pad", "eos", "bos", "mask", "sep", "cls")
             if getattr(tokenizer, f"{r}_token_id", None) == unk]
    if roles:
        also = f", which is also its {'/'.join(roles)} token, and the model would decode garbage"
        raise ValueError(unknown_words_message(tokenizer, words, also))
    warnings.warn(unknown_words_message(tokenizer, words, ""), stacklevel=2)
    return ids


def unknown_words_message(tokenizer: Any, words: Sequence[str], consequence: str) -> str:
    """'the prompt has words the tokenizer does not know: ...', with case hints ('a' -> 'A')."""
    unique = list(dict.fromkeys(words))
    vocab = tokenizer.get_vocab()
    by_lower: dict[str, list[str]] = {}
    for w in vocab:
        by_lower.setdefault(w.lower(), []).append(w)
    hints = [f"{w!r} -> {' or '.join(map(repr, by_lower[w.lower()]))}" for w in unique
             if w.lower() in by_lower]
    msg = (f"the prompt has {len(unique)} word(s) the tokenizer does not know: "
           f"{', '.join(map(repr, unique[:20]))}{' ...' if len(unique) > 20 else ''}; they are encoded as "
           f"its unknown token {tokenizer.unk_token!r} (id {tokenizer.unk_token_id}){consequence}. The "
           f"vocabulary ({len(vocab)} entries, tokenizer.get_vocab()) is matched word by word")
    if hints:
        msg += f"; did you mean {', '.join(hints[:20])}?"
    return msg


def tokenizer_size(tokenizer: Any) -> int:
    """Number of ids the tokenizer can produce (its largest id + 1)."""
    vocab = tokenizer.get_vocab()
    return max(len(tokenizer), (max(vocab.values()) + 1) if vocab else 0)


def has_tokenizer_files(directory: Union[str, Path]) -> bool:
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def save_tokenizer(tokenizer: Any, directory: Union[str, Path]) -> None:
    """tokenizer.save_pretrained with the chat template kept inside tokenizer_config.json (no
    separate .jinja file) and, for a plain fast tokenizer, the class name the official files use."""
    directory = Path(directory)
    tokenizer.save_pretrained(str(directory), save_jinja_files=False)
    config_path = directory / "tokenizer_config.json"
    if not config_path.is_file():
        return
    cfg = json.loads(config_path.read_text())
    plain = ("TokenizersBackend", "PreTrainedTokenizerFast", "PreTrainedTokenizer")
    if cfg.get("tokenizer_class") in plain and getattr(tokenizer, "is_fast", False):
        # transformers 5 writes "TokenizersBackend" and "extra_special_tokens", 4.x knows neither;
        # 4.x writes "PreTrainedTokenizer" (its "Fast" suffix dropped) and a special_tokens_map.json
        # that 5.x does not write: one layout from either.
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        (directory / "special_tokens_map.json").unlink(missing_ok=True)
        extra = cfg.pop("extra_special_tokens", None)
        if isinstance(extra, list):
            cfg["additional_special_tokens"] = extra
        elif extra:
            cfg["extra_special_tokens"] = extra
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def load_tokenizer(directory: Union[str, Path], family: str) -> Any:
    """AutoTokenizer from ``directory``; for checkpoints whose tokenizer class lives in remote code
    (Dream's ``DreamTokenizer``), fall back to the fast tokenizer from tokenizer.json or, for Dream,
    to Qwen2's tokenizer. Returns None when the directory has no tokenizer files."""
    directory = Path(directory)
    if not has_tokenizer_files(directory):
        return None
    from transformers import AutoTokenizer, PretrainedConfig

    try:
        # A blank config stops AutoTokenizer from parsing our config.json (whose model_type it
        # does not know) just to guess a tokenizer class that tokenizer_config.json already names.
        return AutoTokenizer.from_pretrained(str(directory), config=PretrainedConfig())
    except Exception as first:  # e.g. a class that needs trust_remote_code
        try:
            if (directory / "tokenizer.json").is_file():
                from transformers import PreTrainedTokenizerFast

                return PreTrainedTokenizerFast.from_pretrained(str(directory))
            if family == "dream":
                from transformers import Qwen2TokenizerFast

                return Qwen2TokenizerFast.from_pretrained(str(directory))
        except Exception:
            pass
        raise ValueError(f"cannot load the tokenizer in {str(directory)!r}: "
                         f"{str(first).splitlines()[0] if str(first) else type(first).__name__}") from None
