"""The task definitions, one family of tasks per module (each registers its tasks on import:
``dllm.tasks`` imports them all): arithmetic, chains, Latin squares, list edits, long answers, long
prompts, pair picking, Sudoku."""
