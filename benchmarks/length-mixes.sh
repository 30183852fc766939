# The length curriculum's task mixtures (TASK:WEIGHT:LO:HI specs of `benchmarks/key_curriculum.py
# stage`), shared by benchmarks/long-keys.sh and benchmarks/long-keys-dream.sh: prompts of <= 260 /
# 520 / 1,040 / 2,048 words. Sourced, not run.
LEN1="lookup_long:1:4:42 lookup_any:0.25:4:42 span_copy_far:0.5:16:256 count_long:0.5:24:255 count_c4:0.5:24:100"
LEN2="lookup_long:1:4:85 lookup_any:0.25:4:85 span_copy_far:0.5:16:516 count_long:0.5:24:515 count_c4:0.25:24:200"
LEN3="lookup_long:1:4:172 lookup_any:0.25:4:172 span_copy_far:0.5:16:1036 count_long:0.5:24:1035"
LEN4="lookup_long:1:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039 count_long:0.5:24:2040"
