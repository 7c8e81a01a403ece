"""kubelet's CPU assignment test tables (``cpumanager/cpu_assignment_test.go``), restated once so
the predictor's tests and the simulator's run the same cases.

Machines are ``(cpu, core, socket, numa, uncore cache or None)`` rows with kubelet's core id (the
lowest thread), restating its fixtures (``policy_test.go``); CPU sets are canonical cpulists.
"""

from __future__ import annotations

#: ``(cpu, core, socket, numa, uncore cache)``; None: cAdvisor reports no uncore cache.
Row = tuple[int, int, int, int, int | None]

#: ``topoDualSocketHT``: siblings i and i+6, sockets (= NUMA nodes) alternate.
DUAL_SOCKET_HT: list[Row] = [(c, c % 6, c % 2, c % 2, None) for c in range(12)]
#: ``topoDualSocketMultiNumaPerSocketHT``: 2 sockets x 2 NUMA nodes x 10 cores x 2 threads.
DUAL_SOCKET_MULTI_NUMA_HT: list[Row] = [(c, c % 40, c % 40 // 20, c % 40 // 10, None) for c in range(80)]
#: ``topoDualSocketHT`` as the Go literal has it in the uncore cases: every ``UncoreCacheID`` 0.
DUAL_SOCKET_HT_ONE_CACHE: list[Row] = [(c, core, s, n, 0) for c, core, s, n, _u in DUAL_SOCKET_HT]
#: 16 CPUs without SMT in uncore caches of 4 consecutive CPUs: on one socket and NUMA node, on two
#: sockets = NUMA nodes of 8, on one socket of two NUMA nodes; and 8 cores x 2 threads (siblings
#: i, i+8) whose cores 0-3 share cache 0 and 4-7 cache 1.
UNCORE_SINGLE_SOCKET_NO_SMT: list[Row] = [(c, c, 0, 0, c // 4) for c in range(16)]
UNCORE_DUAL_SOCKET_NO_SMT: list[Row] = [(c, c, c // 8, c // 8, c // 4) for c in range(16)]
UNCORE_SINGLE_SOCKET_MULTI_NUMA: list[Row] = [(c, c, 0, c // 8, c // 4) for c in range(16)]
UNCORE_SINGLE_SOCKET_SMT: list[Row] = [(c, c % 8, 0, 0, c % 8 // 4) for c in range(16)]

#: ``TestTakeByTopologyNUMAPacked`` cases with ``PreferAlignByUncoreCacheOption``:
#: (name, machine, available, count, expected).
UNCORE_CASES: list[tuple[str, list[Row], str, int, str]] = [
    (
        "take cpus from two full UncoreCaches and partial from a single UncoreCache",
        UNCORE_SINGLE_SOCKET_NO_SMT,
        "1-15",
        10,
        "1-2,4-11",
    ),
    (
        "take one cpu from dual socket with HT - core from Socket 0",
        DUAL_SOCKET_HT_ONE_CACHE,
        "1-5,7-11",
        1,
        "1",
    ),
    ("take first available UncoreCache from first socket", UNCORE_DUAL_SOCKET_NO_SMT, "0-15", 4, "0-3"),
    ("take all available UncoreCache from first socket", UNCORE_DUAL_SOCKET_NO_SMT, "2-15", 6, "2-7"),
    ("take first available UncoreCache from second socket", UNCORE_DUAL_SOCKET_NO_SMT, "8-15", 4, "8-11"),
    (
        "take first available UncoreCache from available NUMA",
        UNCORE_SINGLE_SOCKET_MULTI_NUMA,
        "3-8,12",
        2,
        "4-5",
    ),
    (
        "take cpus from best available UncoreCache group of multi uncore cache single socket - SMT enabled",
        UNCORE_SINGLE_SOCKET_SMT,
        "2-7,10-15",
        6,
        "4-6,12-14",
    ),
    (
        "take cpus from multiple UncoreCache of single socket - SMT enabled",
        UNCORE_SINGLE_SOCKET_SMT,
        "1-7,9-15",
        10,
        "1,4-7,9,12-15",
    ),
]

#: ``TestTakeByTopologyNUMADistributed``: (name, machine, available, count, cpuGroupSize, expected).
DISTRIBUTED_CASES: list[tuple[str, list[Row], str, int, int, str]] = [
    (
        "allocate 4 full cores with 2 distributed across each NUMA node",
        DUAL_SOCKET_HT,
        "0-11",
        8,
        1,
        "0-3,6-9",
    ),
    (
        "allocate 32 full cores with 8 distributed across each NUMA node",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-79",
        64,
        1,
        "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77",
    ),
    (
        "allocate 24 full cores with 8 distributed across the last 3 NUMA nodes",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "2-29,31-39,42-69,71-79",
        48,
        1,
        "10-17,20-27,31-38,50-57,60-67,71-78",
    ),
    (
        "allocate 8 full cores with 2 distributed across each NUMA node",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71",
        16,
        1,
        "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71",
    ),
    ("take one cpu from dual socket with HT - cpuGroupSize 2", DUAL_SOCKET_HT, "1-5,7-11", 1, 2, "2"),
    (
        "allocate 13 full cores distributed across the first 2 NUMA nodes",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-79",
        26,
        1,
        "0-6,10-16,40-45,50-55",
    ),
    (
        "allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-79",
        26,
        2,
        "0-6,10-15,40-46,50-55",
    ),
    (
        "allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over "
        "to each of NUMA 2, 3 (to keep balance)",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-8,10-18,20-48,50-58,60-79",
        62,
        1,
        "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77",
    ),
    (
        "ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the request",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76",
        34,
        1,
        "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74",
    ),
]
