"""The AC-SGD / TAH-Quant / CocktailSGD runner command line (tools/dist_lm_runner.py), mapped
onto pretrain_gpt.py: flags.py parses the seeds' flags, prepare.py turns a local model and
local task files into a checkpoint and .bin/.idx data, translate.py writes our argv."""
