#!/usr/bin/env python3
"""Tetra's tokenizer against Hugging Face `tokenizers` (run on the GPU machine, which has it).

Builds byte-level BPE tokenizers with the pre-tokenizers GLM-4.x, Qwen2/3 and DeepSeek-V3 ship
(trained here on a mixed corpus with tokenizers' own BpeTrainer), adds the hand-made files of
tests/data/tokenizers, then encodes a corpus of mixed scripts, emoji, code and whitespace runs
with both and compares the ids exactly; decodes the reference ids and random id sequences with
both and compares the text. Usage:
  python3 tests/reference/check_tokenizer.py --tetra path/to/tetra --out DIR
Exit 0 when every comparison matches; the report is DIR/tokenizer_check.json.
"""
import argparse
import json
import os
import random
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GLM4 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
            r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]

FIXED = [
    "Hello world! It's a TEST: we'LL see, they'RE here, I'M done, you'VE won, he'D go.",
    "café naïve résumé Ångström — e\u0301 a\u0308 o\u0302\u0323 \u1E0B\u0323 \u212B \u2126",
    "Ελληνικά κείμενα, русский текст, українська, עברית, العربية ١٢٣, हिन्दी देवनागरी, ไทย",
    "中文文本，日本語のテキストとカタカナ、한국어 텍스트 \u1100\u1161\u11A8 ㈜",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ 🧑🏿‍💻 1️⃣",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\r\n",
    "int main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x += 42;\n}\n",
    '{"key": [1, 2.5e-3, null, true], "s": "a\\"b"}',
    "   leading and trailing   ", "\n\n\n", "\t\t x \t", "a\u00A0b\u3000c\u2003d\u200Be",
    "12345678901234567890 3.14159 1,000,000 -42 0x1F ½ Ⅷ ④",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "<|endoftext|> in the middle <|im_start|>user\nhi<|im_end|>",
    "line one\r\nline two\rline three\n  indented\n\n  \n",
    "ſ 's 'S 'ſ K (Kelvin) 'K 'k",
    "hi <|user|> there", "a  <|user|>\n\nb<|user|>", "<think>x</think> <think>",
    "x<｜User｜>y <｜begin▁of▁sentence｜>z", "[gMASK]<sop>hello",
    "x" * 300 + " " + "y " * 50, " " * 40 + "z", "\n" * 7 + " " * 5,
    "", " ", "a", "ab", "é",
]


def random_texts(rng, n):
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x3000, 0x30FF),
              (0x4E00, 0x4FFF), (0xAC00, 0xACFF), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF)]
    pieces = [" ", "  ", "\n", "\t", "\r\n", "'s", "'LL", "123", "...", "é", "e\u0301"]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.3:
                s.append(rng.choice(pieces))
            else:
                lo, hi = rng.choice(ranges)
                s.append(chr(rng.randint(lo, hi)))
        out.append("".join(s))
    return out


def build(kind, corpus):
    tok = Tokenizer(models.BPE())
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
        splits = [pre_tokenizers.Split(Regex(QWEN2), behavior="isolated")]
    elif kind == "glm4":
        splits = [pre_tokenizers.Split(Regex(GLM4), behavior="isolated")]
    elif kind == "deepseek":
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in DEEPSEEK]
    else:
        splits = []
    if splits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:  # GPT-2 style: ByteLevel does the regex split itself
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=1, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    if kind == "deepseek":
        bos = tok.token_to_id("<|endoftext|>")
        tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def run_tetra(tetra, args):
    r = subprocess.run([tetra, "tokenize"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tetra {' '.join(args)} failed: {r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tetra", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "data", "tokenizers"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(1234)
    texts = FIXED + random_texts(rng, 400)
    train_corpus = FIXED * 20 + random_texts(random.Random(99), 2000)

    files = {}
    for kind in ["qwen2", "glm4", "deepseek", "gpt2"]:
        path = os.path.join(a.out, f"trained_{kind}.json")
        build(kind, train_corpus).save(path)
        files[f"trained_{kind}"] = path
    for name in sorted(os.listdir(a.data)):
        if name.endswith(".json"):
            files[f"handmade_{name[:-5]}"] = os.path.join(a.data, name)

    texts_path = os.path.join(a.out, "texts.json")
    with open(texts_path, "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)

    report, ok = {}, True
    for name, path in files.items():
        ref = Tokenizer.from_file(path)
        want = [ref.encode(t).ids for t in texts]
        got = run_tetra(a.tetra, ["--tokenizer", path, "--batch-json", texts_path])
        enc_bad = [i for i in range(len(texts)) if got[i] != want[i]]
        # Decode: the reference ids, then random id sequences that cut UTF-8 apart.
        # Only ids the vocabulary has: the reference drops unknown ids silently, Tetra refuses them.
        known = sorted(set(ref.get_vocab(with_added_tokens=True).values()))
        rand_ids = [[rng.choice(known) for _ in range(rng.randint(0, 12))] for _ in range(300)]
        id_lists = want + rand_ids
        ids_path = os.path.join(a.out, f"ids_{name}.json")
        with open(ids_path, "w") as f:
            json.dump(id_lists, f)
        want_text = [ref.decode(ids, skip_special_tokens=False) for ids in id_lists]
        try:
            got_text = run_tetra(a.tetra, ["--tokenizer", path, "--decode-batch-json", ids_path])
        except RuntimeError as e:  # a refusal counts as every decode differing
            print(e)
            got_text = [None] * len(id_lists)
        dec_bad = [i for i in range(len(id_lists)) if got_text[i] != want_text[i]]
        report[name] = {"texts": len(texts), "encode_mismatches": len(enc_bad),
                        "decodes": len(id_lists), "decode_mismatches": len(dec_bad),
                        "encode_examples": [{"text": texts[i], "want": want[i], "got": got[i]} for i in enc_bad[:5]],
                        "decode_examples": [{"ids": id_lists[i], "want": want_text[i], "got": got_text[i]}
                                            for i in dec_bad[:5]]}
        ok = ok and not enc_bad and not dec_bad
        for ex in report[name]["encode_examples"][:2]:
            print("  encode differs:", json.dumps(ex, ensure_ascii=False)[:600])
        print(f"{name}: encode {len(texts) - len(enc_bad)}/{len(texts)} identical, "
              f"decode {len(id_lists) - len(dec_bad)}/{len(id_lists)} identical")
    import tokenizers
    report["tokenizers_version"] = tokenizers.__version__
    with open(os.path.join(a.out, "tokenizer_check.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False, indent=1)
    print("ALL IDENTICAL" if ok else "MISMATCHES (see tokenizer_check.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
