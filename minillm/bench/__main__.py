"""python -m minillm.bench latency|throughput|roofs ..."""
import sys

from minillm.bench.cli import main

sys.exit(main())
