//! Capture real diag-tool outputs from a simulated fabric into `tests/data/` and print
//! timings. Run: `cargo run -p weft-testbed --example capture [-- <out dir>]`.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use weft_testbed::{SimFabric, SmSpec, Topology};

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join("data")
        });
    std::fs::create_dir_all(&out)?;
    let save = |name: &str, text: &str| -> Result<(), Box<dyn Error>> {
        std::fs::write(out.join(name), text)?;
        println!("wrote {name} ({} bytes)", text.len());
        Ok(())
    };

    // --- single_switch(4) -------------------------------------------------------------
    let topo = Topology::single_switch(4);
    let mut f = SimFabric::start(&topo)?;
    let n1 = topo.port_guid("node1", 1).ok_or("node1")?;
    let n2 = topo.port_guid("node2", 1).ok_or("node2")?;
    let n3 = topo.port_guid("node3", 1).ok_or("node3")?;
    let parts = f.dir().join("partitions.conf");
    let conf = format!(
        "Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n\
         tenantA=0x0a0a, ipoib : {n1:#018x}=full, {n2:#018x}=full, {n3:#018x}=limited ;\n"
    );
    std::fs::write(&parts, &conf)?;
    save("single_switch4.partitions.conf", &conf)?;
    save("single_switch4.net", &topo.render_ibsim_net())?;
    let t = Instant::now();
    f.start_sm(SmSpec::new("sm1", "smhost", 10, &parts))?;
    println!("SM SUBNET UP after {:?}", t.elapsed());
    let lid = f.diag("node1", "saquery", &["-l", "node1"])?;
    let lid = lid.trim().to_string();
    println!("node1 lid {lid}");
    let q = |host: &str, prog: &str, args: &[&str]| -> Result<String, Box<dyn Error>> {
        let t = Instant::now();
        let r = f.diag(host, prog, args);
        println!("{prog} {args:?} from {host}: {:?}", t.elapsed());
        match r {
            Ok(s) => Ok(s),
            Err(e) => Ok(format!("ERROR: {e}\n")),
        }
    };
    save("saquery_NR.txt", &q("node1", "saquery", &["NR"])?)?;
    save(
        &format!("saquery_NR_lid{lid}.txt"),
        &q("node1", "saquery", &["NR", &lid])?,
    )?;
    save(
        "saquery_NR_switch_lid2.txt",
        &q("node1", "saquery", &["NR", "2"])?,
    )?;
    save(
        "saquery_PKTR_all.txt",
        &q("node1", "saquery", &["--smkey", "1", "PKTR"])?,
    )?;
    save(
        &format!("saquery_PKTR_lid{lid}.txt"),
        &q("node1", "saquery", &["--smkey", "1", "PKTR", &lid])?,
    )?;
    save(
        "saquery_PKTR_switch_lid2_port3.txt",
        &q("node1", "saquery", &["--smkey", "1", "PKTR", "2/3"])?,
    )?;
    save(
        "saquery_PKTR_nosmkey.txt",
        &q("node1", "saquery", &["PKTR", &lid])?,
    )?;
    save(
        &format!("smpquery_pkeys_lid{lid}_port1.txt"),
        &q("node1", "smpquery", &["pkeys", &lid, "1"])?,
    )?;
    save(
        "smpquery_pkeys_switch_lid2_port3.txt",
        &q("node1", "smpquery", &["pkeys", "2", "3"])?,
    )?;
    save("sminfo.txt", &q("node1", "sminfo", &[])?)?;
    save(
        &format!("saquery_PIR_lid{lid}.txt"),
        &q("node1", "saquery", &["PIR", &lid])?,
    )?;
    save("saquery_SMIR.txt", &q("node1", "saquery", &["SMIR"])?)?;
    save(
        "saquery_G_node1.txt",
        &q("node1", "saquery", &["-G", "node1"])?,
    )?;
    save("ibnetdiscover.txt", &q("node1", "ibnetdiscover", &[])?)?;
    save(
        "saquery_NR_switch_lid2_from_smhost.txt",
        &q("smhost", "saquery", &["NR", "2"])?,
    )?;
    save(
        "ibnetdiscover_p.txt",
        &q("node1", "ibnetdiscover", &["-p"])?,
    )?;
    save("ibstat_p.txt", &q("node1", "ibstat", &["-p"])?)?;
    save("ibstat.txt", &q("node1", "ibstat", &[])?)?;
    let sm_dir = f.sm("sm1").ok_or("sm1")?.dir.clone();
    save(
        "opensm-subnet.lst",
        &std::fs::read_to_string(sm_dir.join("opensm-subnet.lst"))?,
    )?;
    save(
        "guid2lid",
        &std::fs::read_to_string(sm_dir.join("cache").join("guid2lid"))?,
    )?;
    // Per-query timing over many runs.
    let t = Instant::now();
    for _ in 0..20 {
        f.diag("node1", "saquery", &["NR", &lid])?;
    }
    println!(
        "saquery NR <lid>: {:?} per call (avg of 20)",
        t.elapsed() / 20
    );
    let t = Instant::now();
    for _ in 0..20 {
        f.diag("node1", "smpquery", &["pkeys", &lid, "1"])?;
    }
    println!(
        "smpquery pkeys: {:?} per call (avg of 20)",
        t.elapsed() / 20
    );
    drop(f);

    // --- fat tree with dual-port HCAs ---------------------------------------------------
    let topo = Topology::fat_tree(4, 2, 36, 4);
    let mut f = SimFabric::start(&topo)?;
    let parts = f.dir().join("partitions.conf");
    std::fs::write(&parts, "Default=0x7fff, ipoib : ALL=full ;\n")?;
    let t = Instant::now();
    let sm = f.start_sm(SmSpec::new("sm1", "smhost", 10, &parts))?;
    println!("fat tree SM SUBNET UP after {:?}", t.elapsed());
    save("fat_tree_4x2x36.net", &topo.render_ibsim_net())?;
    let lst = std::fs::read_to_string(sm.dir.join("opensm-subnet.lst"))?;
    save("fat_tree_opensm-subnet.lst", &lst)?;
    save(
        "fat_tree_saquery_NR.txt",
        &q2(&f, "node4", "saquery", &["NR"]),
    )?;
    // node4 is dual-port: one NodeRecord per port, each port its own LID.
    let lids_by_guid = f.port_lids("smhost")?;
    let mut dual = String::new();
    for (port, guid) in &topo.hca("node4").ok_or("node4")?.port_guids {
        let lid = lids_by_guid.get(guid).ok_or("node4 lid")?.to_string();
        dual.push_str(&format!(
            "### node4 port {port} guid {guid:#018x}: saquery NR {lid}\n"
        ));
        dual.push_str(&q2(&f, "smhost", "saquery", &["NR", &lid]));
    }
    dual.push_str("### saquery NR 2 (a switch)\n");
    dual.push_str(&q2(&f, "smhost", "saquery", &["NR", "2"]));
    save("fat_tree_dual_port_node4_NR.txt", &dual)?;
    save(
        "fat_tree_ibnetdiscover.txt",
        &q2(&f, "node1", "ibnetdiscover", &[]),
    )?;
    // PKTR over all end ports, one saquery per LID.
    let lids: Vec<String> = lst
        .lines()
        .filter(|l| l.starts_with("{ CA"))
        .filter_map(|l| l.split("LID:").nth(1))
        .filter_map(|s| s.get(..4))
        .map(|h| u16::from_str_radix(h, 16).map(|v| v.to_string()))
        .collect::<Result<_, _>>()?;
    let t = Instant::now();
    let mut all = String::new();
    for l in &lids {
        all.push_str(&f.diag("node1", "saquery", &["--smkey", "1", "PKTR", l])?);
    }
    println!(
        "saquery --smkey 1 PKTR <lid> over {} CA ports: {:?}",
        lids.len(),
        t.elapsed()
    );
    let t = Instant::now();
    for l in &lids {
        f.diag("node1", "smpquery", &["pkeys", l, "1"])?;
    }
    println!(
        "smpquery pkeys <lid> 1 over {} CA ports: {:?}",
        lids.len(),
        t.elapsed()
    );
    save("fat_tree_PKTR_per_lid.txt", &all)?;
    Ok(())
}

fn q2(f: &SimFabric, host: &str, prog: &str, args: &[&str]) -> String {
    match f.diag(host, prog, args) {
        Ok(s) => s,
        Err(e) => format!("ERROR: {e}\n"),
    }
}
