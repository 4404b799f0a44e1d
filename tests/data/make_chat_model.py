#!/usr/bin/env python
"""A tiny Hugging Face model directory with a real tokenizer, made offline for the data tests and
the fine-tuning demo: a byte-level BPE trained by PyPI `tokenizers` on the shipped corpus, a
ChatML chat template (in chat_template.jinja, as transformers 5 saves it), and, unless
--tokenizer-only, a small random Llama saved by save_pretrained (fp32).

  $SO_PYTHON tests/data/make_chat_model.py OUT_DIR [--vocab 384] [--no-chat-template] [--tokenizer-only]
"""
import argparse
import os

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--tokenizer-only", action="store_true")
    p.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "..", "..", "data", "corpus",
                                                    "austen.txt"))
    a = p.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train([a.corpus], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if not a.no_chat_template:
        tok.chat_template = CHATML
    os.makedirs(a.out, exist_ok=True)
    tok.save_pretrained(a.out)
    if a.tokenizer_only:
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=None,  # no padding_idx: every embedding row trains, as in so_train
                      eos_token_id=tok.eos_token_id, bos_token_id=None, torch_dtype="float32")
    LlamaForCausalLM(cfg).save_pretrained(a.out)


if __name__ == "__main__":
    main()
