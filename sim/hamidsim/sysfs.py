"""A sysfs tree of a simulated machine, as Linux lays it out, for ``hamid plugin --sysfs-root``.

Written from the machine file so the plugin reads the simulated node through the same code path as
a real one: ``devices/system/cpu/online``, ``cpu<N>/topology/{core_id,physical_package_id}``
(``core_id`` numbered per socket, as the kernel does), ``cpu<N>/cache/index3/{level,id,
shared_cpu_list}`` where the machine names uncore (L3) caches, ``devices/system/node/node<N>/{cpulist,
distance}`` (distances from the machine file, else the kernel's 10 local / 20 remote).
"""

from __future__ import annotations

from pathlib import Path

from hamidsim.kubelet.cadvisor import MachineInfo, format_cpu_list


def write_sysfs_tree(machine: MachineInfo, root: Path) -> Path:
    """Write the tree under ``root`` (blocking: call it in a thread); returns ``root``."""
    topology = machine.cpu_topology
    cpu_dir = root / "devices" / "system" / "cpu"
    node_dir = root / "devices" / "system" / "node"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    (cpu_dir / "online").write_text(format_cpu_list(topology.cpus) + "\n")
    per_socket: dict[int, list[int]] = {}
    for core, cpus in topology.core_cpus.items():
        socket = topology.details[min(cpus)].socket
        per_socket.setdefault(socket, []).append(core)
    core_index = {core: i for cores in per_socket.values() for i, core in enumerate(sorted(cores))}
    for cpu, info in topology.details.items():
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "core_id").write_text(f"{core_index[info.core]}\n")
        (topo / "physical_package_id").write_text(f"{info.socket}\n")
        if info.uncore is not None:
            cache = cpu_dir / f"cpu{cpu}" / "cache" / "index3"
            cache.mkdir(parents=True, exist_ok=True)
            (cache / "level").write_text("3\n")
            (cache / "id").write_text(f"{info.uncore}\n")
            (cache / "shared_cpu_list").write_text(format_cpu_list(topology.uncore_cpus[info.uncore]) + "\n")
    ids = machine.numa_ids
    for node in ids:
        path = node_dir / f"node{node}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpulist").write_text(format_cpu_list(topology.numa_cpus.get(node, ())) + "\n")
        (path / "distance").write_text(" ".join(str(machine.distance(node, other)) for other in ids) + "\n")
    return root
