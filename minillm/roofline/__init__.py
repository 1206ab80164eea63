"""Machine roofs (memory bandwidth, matmul FLOP/s), measured and cached per machine."""
from minillm.roofline.machine import MachineInfo, machine_info
from minillm.roofline.roofs import Measurement, Roofs, get_roofs, measure_roofs

__all__ = ["MachineInfo", "Measurement", "Roofs", "get_roofs", "machine_info", "measure_roofs"]
