"""Loads the files `memfit plan --emit accelerate,hf,deepspeed` wrote through accelerate's and
transformers' own code, the way `accelerate launch --config_file accelerate.yaml` does, and builds
what they build from them: the launch environment and FullyShardedDataParallelPlugin (FSDP), the
DeepSpeed config object (DeepSpeed), TrainingArguments. Any error is a failed check.

Usage: python check_emitted_configs.py DIR [DIR ...]   (each DIR holds one plan's files)
Run by scripts/check_emitted_configs.sh, which makes the directories. Needs torch, accelerate and
transformers; no GPU (the plugin and arguments are built, nothing is launched).
"""

import json
import os
import sys
import warnings

import accelerate
import torch
import transformers
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.deepspeed import HfDeepSpeedConfig
from accelerate.utils.launch import prepare_multi_gpu_env


def launch_env(yaml_path):
    """The environment `accelerate launch --config_file yaml_path` gives each process."""
    args = launch_command_parser().parse_args(["--config_file", yaml_path, "train.py"])
    args, _defaults, _mp = _validate_launch_command(args)
    return args, prepare_multi_gpu_env(args)


def check_dir(d):
    yaml_path = os.path.join(d, "accelerate.yaml")
    cfg = load_config_from_file(yaml_path)
    kind = str(cfg.distributed_type)
    line = f"{d}: distributed_type {kind}, {cfg.num_processes} processes on {cfg.num_machines} machine(s)"
    saved = dict(os.environ)
    try:
        if kind.endswith("FSDP"):
            args, env = launch_env(yaml_path)
            os.environ.update(env)
            try:
                plugin = FullyShardedDataParallelPlugin()
            except RuntimeError as e:
                # FSDP1's sync_module_states asks torch for the current GPU while the plugin is built
                if "no available devices" not in str(e) or env.get("FSDP_SYNC_MODULE_STATES") != "true":
                    raise
                os.environ["FSDP_SYNC_MODULE_STATES"] = "false"
                plugin = FullyShardedDataParallelPlugin()
                line += "; sync_module_states=true needs a GPU to build the plugin: built with it false here"
            fc = cfg.fsdp_config
            assert plugin.fsdp_version == fc["fsdp_version"], plugin.fsdp_version
            if plugin.fsdp_version == 1:
                # the strategy the YAML asked for is the one the plugin got
                assert plugin.sharding_strategy.name == fc["fsdp_reshard_after_forward"], plugin.sharding_strategy
                line += f"; sharding_strategy={plugin.sharding_strategy.name}"
            else:
                assert plugin.reshard_after_forward == fc["fsdp_reshard_after_forward"]
            line += (
                f"; FSDP plugin v{plugin.fsdp_version}: reshard_after_forward={plugin.reshard_after_forward}"
                f", auto_wrap_policy={getattr(plugin.auto_wrap_policy, '__name__', plugin.auto_wrap_policy)}"
                f", state_dict_type={plugin.state_dict_type}, cpu_offload={plugin.cpu_offload}"
                f", activation_checkpointing={plugin.activation_checkpointing}"
                f", mixed_precision env={env.get('ACCELERATE_MIXED_PRECISION')}"
            )
        elif kind.endswith("DEEPSPEED"):
            ds_file = cfg.deepspeed_config["deepspeed_config_file"]
            with open(os.path.join(d, ds_file)) as f:
                ds = HfDeepSpeedConfig(json.load(f))
            line += f"; DeepSpeed config: ZeRO stage {ds.get_value('zero_optimization.stage')}, offload {ds.is_offload()}"
        elif kind.endswith("MULTI_GPU"):
            _args, env = launch_env(yaml_path)
            line += f"; DDP launch env: {env.get('ACCELERATE_MIXED_PRECISION')} mixed precision"
        hf_path = os.path.join(d, "training_args.json")
        if os.path.exists(hf_path):
            with open(hf_path) as f:
                hf = json.load(f)
            hf["output_dir"] = os.path.join(d, hf["output_dir"])
            if "deepspeed" in hf:
                # TrainingArguments imports deepspeed itself to build the engine's config
                line += "; TrainingArguments not built (needs the deepspeed package)"
            else:
                # bf16 needs a device that has it; the check is of the arguments, not of this machine
                hf["use_cpu"] = True
                targs = transformers.TrainingArguments(**hf)
                line += f"; TrainingArguments ok (fsdp={targs.fsdp}, plugin args={targs.fsdp_plugin_args})"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    print(line)


def main():
    warnings.simplefilter("ignore")
    print(
        f"torch {torch.__version__}, accelerate {accelerate.__version__}, transformers {transformers.__version__}"
    )
    failed = 0
    for d in sys.argv[1:]:
        try:
            check_dir(d)
        except Exception as e:  # every failure is reported, then the exit code says so
            failed += 1
            print(f"{d}: FAILED: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
