//! The plugin's ncclNet structs against NCCL's own C headers, field by field.
//!
//! `cargo run -p weft-nccl-net --example abi_layout` prints, for every `#[repr(C)]` struct of
//! `ffi.rs`, one line per field (`C_TYPE FIELD OFFSET`) and its size (`C_TYPE sizeof SIZE`),
//! named by the C type it mirrors. `-- --c SET` prints a C program that prints the same lines
//! with `offsetof`/`sizeof` from NCCL's headers (SET: `v11` for NCCL 2.28's
//! `ext-net/example/nccl`, which ends at v11; `v12` for the later `plugins/net/example/nccl`).
//! `scripts/abi/check_ncclnet_abi.sh` compiles that program against the headers and diffs the
//! two outputs: any difference is an ABI bug. The numbers are not checked in; the headers are
//! NCCL's, read where they are, never copied into this repository.

use std::mem::{offset_of, size_of};

use nccl_net_weft::ffi::*;

/// One mirrored struct: the C type it must match, the header set that has that type, and
/// (field, offset) for every field, then the size.
struct Layout {
    c_type: &'static str,
    set: &'static str,
    fields: Vec<(&'static str, usize)>,
    size: usize,
}

macro_rules! layout {
    ($rust:ty => $c:literal in $set:literal { $($f:ident),* $(,)? }) => {
        Layout {
            c_type: $c,
            set: $set,
            fields: vec![$((stringify!($f), offset_of!($rust, $f))),*],
            size: size_of::<$rust>(),
        }
    };
}

macro_rules! net_table {
    ($rust:ty => $c:literal in $set:literal $(, $extra:ident)*) => {
        layout!($rust => $c in $set {
            name, init, devices, getProperties, listen, connect, accept, regMr, regMrDmaBuf,
            deregMr, isend, irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr,
            irecvConsumed $(, $extra)*
        })
    };
}

macro_rules! props {
    ($rust:ty => $c:literal in $set:literal $(, $extra:ident)*) => {
        layout!($rust => $c in $set {
            name, pciPath, guid, ptrSupport, regIsGlobal $(, $extra)*
        })
    };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!(ncclNetDeviceHandle_t => "ncclNetDeviceHandle_v7_t" in "v11" {
            netDeviceType, netDeviceVersion, handle, size, needsProxyProgress
        }),
        props!(ncclNetProperties_v8_t => "ncclNetProperties_v8_t" in "v11",
            speed, port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion),
        layout!(ncclNetVDeviceProps_v9_t => "ncclNetVDeviceProps_v9_t" in "v11" { ndevs, devs }),
        layout!(ncclNetVDeviceProps_v9_t => "ncclNetVDeviceProps_v10_t" in "v11" { ndevs, devs }),
        layout!(ncclNetVDeviceProps_v9_t => "ncclNetVDeviceProps_v11_t" in "v11" { ndevs, devs }),
        layout!(ncclNetVDeviceProps_v12_t => "ncclNetVDeviceProps_v12_t" in "v12" { ndevs, devs }),
        props!(ncclNetProperties_v9_t => "ncclNetProperties_v9_t" in "v11", forceFlush, speed,
            port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps,
            maxP2pBytes, maxCollBytes),
        // v10's tables take the v9 properties type: NCCL's v10 struct must be the same.
        props!(ncclNetProperties_v9_t => "ncclNetProperties_v10_t" in "v11", forceFlush, speed,
            port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps,
            maxP2pBytes, maxCollBytes),
        props!(ncclNetProperties_v11_t => "ncclNetProperties_v11_t" in "v11", forceFlush, speed,
            port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps,
            maxP2pBytes, maxCollBytes, maxMultiRequestSize),
        props!(ncclNetProperties_v12_t => "ncclNetProperties_v12_t" in "v12", forceFlush, speed,
            port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps,
            maxP2pBytes, maxCollBytes, maxMultiRequestSize, railId, planeId),
        layout!(ncclNetCommConfig_t => "ncclNetCommConfig_v10_t" in "v11" { trafficClass }),
        layout!(ncclNetCommConfig_t => "ncclNetCommConfig_v11_t" in "v11" { trafficClass }),
        layout!(ncclNetCommConfig_t => "ncclNetCommConfig_v12_t" in "v12" { trafficClass }),
        layout!(ncclNetAttr_t => "ncclNetAttr_v11_t" in "v11" {
            sendCommAttr, recvCommAttr, op, algo, proto
        }),
        layout!(ncclNetAttr_t => "ncclNetAttr_v12_t" in "v12" {
            sendCommAttr, recvCommAttr, op, algo, proto
        }),
        net_table!(ncclNet_v8_t => "ncclNet_v8_t" in "v11"),
        net_table!(ncclNet_v9_t => "ncclNet_v9_t" in "v11", makeVDevice),
        net_table!(ncclNet_v10_t => "ncclNet_v10_t" in "v11", makeVDevice),
        net_table!(ncclNet_v11_t => "ncclNet_v11_t" in "v11", makeVDevice, finalize, setNetAttr),
        net_table!(ncclNet_v12_t => "ncclNet_v12_t" in "v12", makeVDevice, finalize, setNetAttr),
    ]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let c_set = match args.as_slice() {
        [] => None,
        [flag, set] if flag == "--c" && (set == "v11" || set == "v12") => Some(set.clone()),
        _ => {
            eprintln!("usage: abi_layout [--c v11|v12]");
            std::process::exit(2);
        }
    };
    let all = layouts();
    match c_set {
        None => {
            for l in &all {
                for (f, off) in &l.fields {
                    println!("{} {} {}", l.c_type, f, off);
                }
                println!("{} sizeof {}", l.c_type, l.size);
            }
        }
        Some(set) => {
            println!("/* generated by `cargo run --example abi_layout -- --c {set}` */");
            println!("#include <stddef.h>\n#include <stdio.h>\n#include \"net.h\"");
            if set == "v12" {
                println!("#include \"net_v12.h\"");
            }
            println!("int main(void) {{");
            for l in all.iter().filter(|l| l.set == set) {
                for (f, _) in &l.fields {
                    println!(
                        "  printf(\"{t} {f} %zu\\n\", offsetof({t}, {f}));",
                        t = l.c_type
                    );
                }
                println!(
                    "  printf(\"{t} sizeof %zu\\n\", sizeof({t}));",
                    t = l.c_type
                );
            }
            println!("  return 0;\n}}");
        }
    }
}
