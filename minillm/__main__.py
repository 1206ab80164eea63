"""`python -m minillm ...`: the `minillm` command (what torchrun runs: `torchrun ... -m minillm serve ...`)."""
from minillm.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
