#!/usr/bin/env python3
"""Writes the small tokenizer.json files the tokenizer tests use. Byte b has id b (in GPT-2's
byte-level alphabet); merges then add ids 256, 257, ... in the order listed, so expected ids can
be worked out by hand; added tokens follow the vocabulary (270, 271, ...), as Hugging Face
numbers them. Run from this folder: python3 make_tokenizers.py"""
import json

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GLM4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_PATTERNS = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def byte_chars():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + n)
            n += 1
    return out


def bl(text):
    """Byte-level spelling of a UTF-8 string."""
    m = byte_chars()
    return "".join(m[b] for b in text.encode("utf-8"))


def bpe(merge_pairs, pair_format):
    m = byte_chars()
    vocab = {m[b]: b for b in range(256)}
    merges = []
    for a, b in merge_pairs:
        a, b = bl(a) if not isinstance(a, tuple) else a[0], bl(b) if not isinstance(b, tuple) else b[0]
        assert a in vocab and b in vocab, (a, b)
        vocab.setdefault(a + b, len(vocab))
        merges.append([a, b] if pair_format else f"{a} {b}")
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": merges}


def added(id_, content, special=True, normalized=False, lstrip=False, rstrip=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


# 256 he, 257 ll, 258 hell, 259 hello, 260 " w", 261 or, 262 " wor", 263 ld, 264 " world",
# 265 "é" (two bytes), 266 " t", 267 "  " (two spaces), 268 "12", 269 "!hello"
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w"), ("o", "r"),
          (" w", "or"), ("l", "d"), (" wor", "ld"), (("\u00c3",), ("\u00a9",)), (" ", "t"), (" ", " "),
          ("1", "2"), ("!", "hello")]


def write(name, obj):
    with open(name, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    qwen = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(270, "<|endoftext|>"), added(271, "<|im_start|>"), added(272, "<|im_end|>"),
                         added(273, "<think>", special=False)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": bpe(MERGES, pair_format=False),
    }
    write("qwen2_style.json", qwen)

    glm = dict(qwen)
    glm["normalizer"] = None
    glm["added_tokens"] = [added(270, "<|endoftext|>"), added(271, "[gMASK]"), added(272, "<sop>"),
                           added(273, "<|user|>", lstrip=True, rstrip=True)]
    glm["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GLM4_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    glm["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "[gMASK]", "type_id": 0}},
                                        {"SpecialToken": {"id": "<sop>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [], "special_tokens": {
                                 "[gMASK]": {"id": "[gMASK]", "ids": [271], "tokens": ["[gMASK]"]},
                                 "<sop>": {"id": "<sop>", "ids": [272], "tokens": ["<sop>"]}}}
    glm["model"] = bpe(MERGES, pair_format=True)
    write("glm4_style.json", glm)

    ds = dict(qwen)
    ds["normalizer"] = {"type": "Sequence", "normalizers": []}
    ds["added_tokens"] = [added(270, "<｜begin▁of▁sentence｜>"), added(271, "<｜end▁of▁sentence｜>"),
                          added(272, "<｜User｜>", special=False)]
    ds["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}
        for p in DEEPSEEK_PATTERNS] + [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    ds["post_processor"] = {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [], "special_tokens": {"<｜begin▁of▁sentence｜>": {
                                "id": "<｜begin▁of▁sentence｜>", "ids": [270], "tokens": ["<｜begin▁of▁sentence｜>"]}}}
    ds["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    write("deepseek_v3_style.json", ds)

    gpt2 = dict(qwen)
    gpt2["normalizer"] = None
    gpt2["added_tokens"] = []
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    write("gpt2_style.json", gpt2)


main()
