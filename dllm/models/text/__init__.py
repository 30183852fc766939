"""Text in and out of a model: word-level tokenizers and tokenizer files (``tokenizer``), the PB-mini
task tokenizer (``task_tokenizer``) and a model's chat template and prompt ids (``prompting``)."""
