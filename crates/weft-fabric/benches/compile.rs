//! compile + render of 1,000 nodes (one CA port each) in 100 partitions of 10 nodes.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use weft_fabric::{
    FabricPlan, Guid, Inventory, NodeType, PlanMember, PlanPartition, Port, compile, conf,
};

fn setup() -> (FabricPlan, Inventory) {
    let ports = (0..1000u64)
        .map(|i| Port {
            node_guid: Guid(0x0002_c903_0000_0000 + (i + 1) * 0x100),
            port_guid: Guid(0x0002_c903_0000_0000 + (i + 1) * 0x100 + 1),
            port_num: 1,
            lid: u16::try_from(i + 1).unwrap_or(0),
            node_type: NodeType::Ca,
            node_desc: format!("node{i} mlx5_0"),
            pkey_capacity: 128,
        })
        .collect();
    let inv = Inventory {
        ports,
        sm_port_guid: Some(Guid(0x0002_c903_0000_0101)),
    };
    let mut plan = FabricPlan::default();
    for p in 0..100 {
        let mut part = PlanPartition::new(&format!("part{p}"), &format!("tenant{p}"));
        part.ipoib = true;
        part.mtu = Some(4);
        part.members = (0..10)
            .map(|n| PlanMember::node(&format!("node{}", p * 10 + n)))
            .collect();
        plan.partitions.push(part);
    }
    (plan, inv)
}

fn bench(c: &mut Criterion) {
    let (plan, inv) = setup();
    // The measured case must be the successful path, not a list of violations.
    assert!(compile(&plan, Some(&inv)).is_ok());
    c.bench_function("compile_render_1000_nodes_100_partitions", |b| {
        b.iter(|| {
            let compiled = compile(black_box(&plan), Some(black_box(&inv))).map_err(|v| v.len());
            let text = compiled.map(|c| conf::render(&c.conf));
            black_box(text)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
