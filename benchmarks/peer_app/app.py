"""The peer's side of bench_local: a trivial Hydra task, swept by hydra-submitit-launcher."""

import hydra


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg) -> int:
    return int(cfg.get("x", 0))


if __name__ == "__main__":
    main()
