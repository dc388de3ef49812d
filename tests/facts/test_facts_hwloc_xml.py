"""hwloc XML import: the format's corners on small hand-written files, and bad input.

Real exports are checked against hwloc's own tools in test_facts_vs_hwloc.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cod.facts import hwloc_xml
from cod.facts.model import FactsError
from helpers.data import HWLOC_DIR


V2_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n'


def v2_two_packages(indexing: str = "os", memcache: bool = False) -> str:
    """Two packages; node 1 is first in document order (logical != os order);
    PUs of a core are 0+8 style SMT pairs; optional MemCache around the nodes."""
    def node(os_index: int, gp: int, cpuset: str, mem: int) -> str:
        obj = (f'<object type="NUMANode" os_index="{os_index}" cpuset="{cpuset}" '
               f'gp_index="{gp}" local_memory="{mem}"/>')
        if memcache:
            return (f'<object type="MemCache" cpuset="{cpuset}" cache_size="1073741824" '
                    f'depth="1" cache_type="0">{obj}</object>')
        return obj

    def core(a: int, b: int) -> str:
        mask = (1 << a) | (1 << b)
        return (f'<object type="Core" os_index="{a}" cpuset="0x{mask:08x}">'
                f'<object type="PU" os_index="{a}" cpuset="0x{1 << a:08x}"/>'
                f'<object type="PU" os_index="{b}" cpuset="0x{1 << b:08x}"/></object>')

    pkg0 = (f'<object type="Package" os_index="7" cpuset="0x00000303">'
            f'{node(1, 11, "0x00000303", 1 << 30)}'
            f'<object type="L3Cache" cpuset="0x00000303" cache_size="8388608" depth="3" '
            f'cache_type="0">{core(0, 8)}{core(1, 9)}</object></object>')
    pkg1 = (f'<object type="Package" os_index="3" cpuset="0x00000c0c">'
            f'{node(0, 10, "0x00000c0c", 2 << 30)}'
            f'<object type="L3Cache" cpuset="0x00000c0c" cache_size="8388608" depth="3" '
            f'cache_type="0"><object type="L2Cache" cpuset="0x00000c0c" cache_size="1048576" '
            f'depth="2" cache_type="0"><object type="L1iCache" cpuset="0x00000404" '
            f'cache_size="32768" depth="1" cache_type="2">{core(2, 10)}</object>'
            f'{core(3, 11)}</object></object></object>')
    idx = "1 0" if indexing == "os" else "11 10"
    return (V2_HEAD + '<topology version="2.0"><object type="Machine" os_index="0" '
            'cpuset="0x00000f0f" allowed_cpuset="0xf...f">'
            '<object type="PCIDev" pci_busid="0000:00:01.0"/>'
            f'{pkg0}{pkg1}</object>'
            f'<distances2 type="NUMANode" nbobjs="2" kind="5" indexing="{indexing}">'
            f'<indexes length="4">{idx}</indexes><u64values length="5">10 21</u64values>'
            '<u64values length="5">21 10</u64values></distances2>'
            '<distances2 type="NUMANode" nbobjs="2" kind="9" indexing="os">'
            '<indexes length="4">0 1</indexes><u64values length="5">1 2 3 4</u64values>'
            '</distances2></topology>')


@pytest.mark.parametrize("indexing", ["os", "gp"])
@pytest.mark.parametrize("memcache", [False, True])
def test_v2_by_os_numbers(tmp_path, indexing, memcache):
    path = tmp_path / "t.xml"
    path.write_text(v2_two_packages(indexing, memcache))
    m = hwloc_xml.load(path)
    assert [(p.id, p.cpus) for p in m.packages] == [(3, (2, 3, 10, 11)), (7, (0, 1, 8, 9))]
    assert [(n.id, n.cpus, n.memory_bytes) for n in m.numa_nodes] == \
        [(0, (2, 3, 10, 11), 2 << 30), (1, (0, 1, 8, 9), 1 << 30)]
    # indexes "1 0": row 0 of the matrix is node 1.  The bandwidth matrix is ignored.
    assert m.numa_nodes[1].distances == {1: 10, 0: 21}
    assert [c.pus for c in m.cores] == [(0, 8), (1, 9), (2, 10), (3, 11)]
    assert [(p.id, p.core, p.package, p.numa_node) for p in m.pus][:3] == \
        [(0, 0, 7, 1), (1, 1, 7, 1), (2, 2, 3, 0)]
    assert [(c.level, c.type, c.cpus) for c in m.caches] == [
        (1, "instruction", (2, 10)), (2, "unified", (2, 3, 10, 11)),
        (3, "unified", (0, 1, 8, 9)), (3, "unified", (2, 3, 10, 11))]
    assert m.total_memory_bytes == 3 << 30
    assert m.allowed_cpus is None  # an infinite allowed set restricts nothing


V1 = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc.dtd">
<topology>
  <object type="Machine" os_index="0" cpuset="0x0000000f" online_cpuset="0x0000000f"
          allowed_cpuset="0x00000003" nodeset="0x00000006" allowed_nodeset="0x00000002"
          local_memory="0">
    <distances nbobjs="2" relative_depth="1" latency_base="10.000000">
      <latency value="1.000000"/><latency value="2.200000"/>
      <latency value="2.200000"/><latency value="1.000000"/>
    </distances>
    <distances nbobjs="4" relative_depth="4" latency_base="1.000000">
      <latency value="1"/><latency value="2"/><latency value="2"/><latency value="2"/>
      <latency value="2"/><latency value="1"/><latency value="2"/><latency value="2"/>
      <latency value="2"/><latency value="2"/><latency value="1"/><latency value="2"/>
      <latency value="2"/><latency value="2"/><latency value="2"/><latency value="1"/>
    </distances>
    <object type="NUMANode" os_index="2" cpuset="0x0000000c" local_memory="4096">
      <object type="Socket" os_index="1" cpuset="0x0000000c">
        <object type="Cache" cpuset="0x0000000c" cache_size="2048" depth="2" cache_type="0">
          <object type="Core" os_index="0" cpuset="0x00000004"><object type="PU" os_index="2"/></object>
          <object type="Core" os_index="1" cpuset="0x00000008"><object type="PU" os_index="3"/></object>
        </object>
      </object>
    </object>
    <object type="NUMANode" os_index="1" cpuset="0x00000003" local_memory="8192">
      <object type="Socket" os_index="0" cpuset="0x00000003">
        <object type="Cache" cpuset="0x00000001" cache_size="64" depth="1" cache_type="1">
          <object type="Core" os_index="0" cpuset="0x00000001"><object type="PU" os_index="0"/></object>
        </object>
        <object type="Core" os_index="1" cpuset="0x00000002"><object type="PU" os_index="1"/></object>
      </object>
    </object>
  </object>
</topology>
"""


def test_v1_tree_levels_and_distances(tmp_path):
    path = tmp_path / "v1.xml"
    path.write_text(V1)
    m = hwloc_xml.load(path)
    assert [(p.id, p.cpus) for p in m.packages] == [(0, (0, 1)), (1, (2, 3))]
    assert [(n.id, n.cpus, n.memory_bytes) for n in m.numa_nodes] == \
        [(1, (0, 1), 8192), (2, (2, 3), 4096)]
    # relative_depth 1 below Machine is the NUMA level, in document order: node 2, node 1.
    assert m.numa_nodes[0].distances == {2: 22, 1: 10}
    assert [(c.level, c.type, c.size_bytes, c.cpus) for c in m.caches] == \
        [(1, "data", 64, (0,)), (2, "unified", 2048, (2, 3))]
    assert m.allowed_cpus == (0, 1) and m.allowed_mems == (1,)


@pytest.mark.parametrize("content, complaint", [
    ("", "not well-formed XML"),
    (V2_HEAD + '<topology version="2.0"><object type="Machine" cpuset="0x1">',
     "not well-formed XML"),                                       # truncated
    ('<?xml version="1.0"?><svg><rect/></svg>', "not an hwloc topology: root element is <svg>"),
    ('<topology version="2.0"></topology>', "holds no <object>"),
    ('<topology version="2.0"><object type="Machine" cpuset="0x1"/></topology>', "no PU"),
    ('<topology version="2.0"><object type="Machine" cpuset="0x1"><object type="PU"/>'
     '</object></topology>', "PU object without os_index"),
    ('<topology version="2.0"><object type="Machine" cpuset="0x1"><object type="PU" '
     'os_index="zero"/></object></topology>', "os_index='zero' is not an integer"),
    ('<topology version="2.0"><object type="Machine" cpuset="0x1"><object type="NUMANode" '
     'os_index="0" cpuset="0xzz"/><object type="PU" os_index="0"/></object></topology>',
     "NUMANode object: attribute cpuset: bad hwloc bitmap word"),
    ('<topology version="2.0"><object type="Machine" cpuset="0x1"><object type="NUMANode" '
     'os_index="0" cpuset="0x1"/><object type="PU" os_index="0"/></object>'
     '<distances2 type="NUMANode" nbobjs="2" kind="5" indexing="os"><indexes>0 1</indexes>'
     '<u64values>10 20 20 10</u64values></distances2></topology>', r"node\(s\) \[1\] not in"),
    ('<topology version="2.0"><object type="Machine" cpuset="0x1"><object type="NUMANode" '
     'os_index="0" cpuset="0x1"/><object type="PU" os_index="0"/></object>'
     '<distances2 type="NUMANode" nbobjs="1" kind="5" indexing="os"><indexes>0</indexes>'
     '<u64values>10 20</u64values></distances2></topology>', "1 indexes and 2 values"),
])
def test_bad_files_name_the_file_and_the_fault(tmp_path, content, complaint):
    path = tmp_path / "bad.xml"
    path.write_text(content)
    with pytest.raises(FactsError, match=complaint) as info:
        hwloc_xml.load(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FactsError, match="no such file"):
        hwloc_xml.load(tmp_path / "absent.xml")
    with pytest.raises(FactsError, match="is a directory"):
        hwloc_xml.load(tmp_path)


def test_truncated_real_export(tmp_path):
    text = (HWLOC_DIR / "192em64t-24n8c2t.xml").read_text()
    path = tmp_path / "cut.xml"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(FactsError, match="cut.xml: not well-formed XML"):
        hwloc_xml.load(path)
