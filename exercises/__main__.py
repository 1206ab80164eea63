"""python -m exercises [names...] [--impl learner|solutions|reference]: run the checks, one line each."""
from __future__ import annotations

import argparse
import sys
import time
import traceback


def main(argv: list[str] | None = None) -> int:
    from exercises.checks import run_check
    from minillm.exercises import EXERCISES, implementation

    ap = argparse.ArgumentParser(prog="python -m exercises", description=__doc__)
    ap.add_argument("names", nargs="*", help=f"exercises to check (default: all): {', '.join(EXERCISES)}")
    ap.add_argument("--impl", default="learner", choices=["learner", "solutions", "reference"],
                    help="whose code to check (default: yours, in exercises/)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the traceback of a failing check")
    args = ap.parse_args(argv)
    failed = 0
    for name in args.names or EXERCISES:
        t0 = time.perf_counter()
        try:
            run_check(name, implementation(name, args.impl))
            print(f"PASS  {name:<15} {time.perf_counter() - t0:5.1f} s")
        except NotImplementedError as e:
            failed += 1
            print(f"TODO  {name:<15} {e}")
        except Exception as e:  # an AssertionError says what is wrong; anything else is a bug to see
            failed += 1
            print(f"FAIL  {name:<15} {type(e).__name__}: {e}")
            if args.verbose:
                traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
