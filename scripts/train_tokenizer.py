"""Rebuild src/servelab/data/tokenizer.json, the simulator's subword tokenizer.

A byte-level BPE (16,384 tokens, GPT-2 style pre-tokenisation) trained on the shipped
KJV excerpts plus the CPython standard library's sources (for modern English and code).
Only the resulting vocabulary is shipped. Run: .venv/bin/python scripts/train_tokenizer.py
"""
import glob
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DATA = Path(__file__).resolve().parents[1] / "src" / "servelab" / "data"


def main() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = [str(DATA / "kjv_excerpts.txt")]
    files += sorted(glob.glob(stdlib + "/*.py"))[:400]
    files += sorted(glob.glob(stdlib + "/pydoc_data/*.py"))
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=16384,
        min_frequency=2,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    tok.save(str(DATA / "tokenizer.json"))


if __name__ == "__main__":
    main()
