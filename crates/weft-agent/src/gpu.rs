//! GPUs through NVML, opened at run time.
//!
//! `libnvidia-ml.so.1` is `dlopen`ed, never linked: the agent must run on hosts without an
//! NVIDIA driver (a management node, a CI runner), and a link dependency on a missing
//! library would stop it from starting at all.
//!
//! Where NVML cannot be opened but `nvidia-smi` runs (a driver installed without its
//! library on the loader path, a container with only the tool mounted), the caller may run
//! `nvidia-smi` with [`NVIDIA_SMI_ARGS`] (bounded; this crate starts no process) and read its
//! output with [`parse_nvidia_smi`].

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use libloading::Library;

use crate::types::Gpu;

/// The NVML library name the driver installs.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

type Ret = c_int;
type Device = *mut c_void;
const NVML_SUCCESS: Ret = 0;
/// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE.
const TEXT_BUFFER: usize = 96;

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlPciInfo_t`.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

// Signatures from nvml.h.
type InitFn = unsafe extern "C" fn() -> Ret;
type ShutdownFn = unsafe extern "C" fn() -> Ret;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> Ret;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> Ret;
type TextFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret;
type MemoryFn = unsafe extern "C" fn(Device, *mut Memory) -> Ret;
type PciFn = unsafe extern "C" fn(Device, *mut PciInfo) -> Ret;

/// The GPUs NVML reports, or none where NVML is absent or fails (logged at debug level):
/// a host without GPUs is a normal host.
pub fn nvml_gpus() -> Vec<Gpu> {
    match gpus_from(NVML_LIBRARY) {
        Ok(gpus) => gpus,
        Err(reason) => {
            tracing::debug!("no GPUs from NVML: {reason}");
            Vec::new()
        }
    }
}

/// Looks a symbol up.
///
/// # Safety
/// `T` must be the function pointer type of the symbol as nvml.h declares it, and the
/// pointer must not be used after `lib` is dropped.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: the caller guarantees `T` is the symbol's type and bounds its lifetime.
    unsafe { lib.get::<T>(&cname) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

/// Calls nvmlShutdown when dropped (after a successful nvmlInit).
struct Session(ShutdownFn);

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: nvmlInit succeeded and the library is still loaded (the session is
        // dropped before the Library in `gpus_from`).
        unsafe { (self.0)() };
    }
}

fn text(buf: &[c_char]) -> Option<String> {
    // c_char is i8 or u8 by target; reinterpret as bytes.
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .ok()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
}

/// `00000000:01:00.0` -> `0000:01:00.0` (sysfs form, lower case).
fn sysfs_bus_id(bus_id: &str) -> String {
    let lower = bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() == 8 && domain.starts_with("0000") => {
            format!("{}:{rest}", &domain[4..])
        }
        _ => lower,
    }
}

fn gpus_from(library: &str) -> Result<Vec<Gpu>, String> {
    // SAFETY: loading runs the library's initialisers; NVML is made to be dlopened (nvidia-smi,
    // NCCL and DCGM all do), and its initialisers have no preconditions on the caller.
    let lib = unsafe { Library::new(library) }.map_err(|e| e.to_string())?;
    // SAFETY: for this and the `sym` calls below: each type alias above is the nvml.h
    // signature of the named function, and every pointer is used only inside this
    // function, while `lib` is alive.
    let init: InitFn = unsafe { sym(&lib, "nvmlInit_v2") }?;
    // SAFETY: as above.
    let shutdown: ShutdownFn = unsafe { sym(&lib, "nvmlShutdown") }?;
    // SAFETY: as above.
    let count_fn: CountFn = unsafe { sym(&lib, "nvmlDeviceGetCount_v2") }?;
    // SAFETY: as above.
    let handle_fn: HandleFn = unsafe { sym(&lib, "nvmlDeviceGetHandleByIndex_v2") }?;
    // SAFETY: as above.
    let name_fn: TextFn = unsafe { sym(&lib, "nvmlDeviceGetName") }?;
    // SAFETY: as above.
    let uuid_fn: TextFn = unsafe { sym(&lib, "nvmlDeviceGetUUID") }?;
    // SAFETY: as above.
    let memory_fn: MemoryFn = unsafe { sym(&lib, "nvmlDeviceGetMemoryInfo") }?;
    // SAFETY: as above; older drivers lack the v3 name, and the PCI address is optional.
    let pci_fn: Option<PciFn> = unsafe { sym(&lib, "nvmlDeviceGetPciInfo_v3") }.ok();

    // SAFETY: nvmlInit_v2 takes no arguments and may be called from any thread.
    let rc = unsafe { init() };
    if rc != NVML_SUCCESS {
        return Err(format!("nvmlInit_v2 returned {rc}"));
    }
    let session = Session(shutdown);

    let mut count: c_uint = 0;
    // SAFETY: `count` is a valid place for one unsigned int.
    let rc = unsafe { count_fn(&mut count) };
    if rc != NVML_SUCCESS {
        return Err(format!("nvmlDeviceGetCount_v2 returned {rc}"));
    }

    let mut gpus = Vec::new();
    for index in 0..count {
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: `dev` is a valid place for a device handle; `index` < count.
        let rc = unsafe { handle_fn(index, &mut dev) };
        if rc != NVML_SUCCESS {
            // A GPU we may not access (cgroup, MIG) is skipped, not fatal.
            tracing::debug!("nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}");
            continue;
        }
        let mut name_buf = [0 as c_char; TEXT_BUFFER];
        // SAFETY: `name_buf` is valid for TEXT_BUFFER chars, the length passed; NVML writes
        // a NUL-terminated string within it.
        let rc = unsafe { name_fn(dev, name_buf.as_mut_ptr(), TEXT_BUFFER as c_uint) };
        let name = if rc == NVML_SUCCESS {
            text(&name_buf)
        } else {
            None
        };
        let mut uuid_buf = [0 as c_char; TEXT_BUFFER];
        // SAFETY: as for the name.
        let rc = unsafe { uuid_fn(dev, uuid_buf.as_mut_ptr(), TEXT_BUFFER as c_uint) };
        let uuid = if rc == NVML_SUCCESS {
            text(&uuid_buf)
        } else {
            None
        };
        let mut mem = Memory::default();
        // SAFETY: `mem` is a valid nvmlMemory_t (v1) to fill.
        let rc = unsafe { memory_fn(dev, &mut mem) };
        // GB10 (DGX Spark) answers NOT_SUPPORTED: its memory is unified with the CPU's.
        let memory_total_bytes = (rc == NVML_SUCCESS).then_some(mem.total);
        let pci = pci_fn.and_then(|f| {
            let mut info = PciInfo {
                bus_id_legacy: [0; 16],
                domain: 0,
                bus: 0,
                device: 0,
                pci_device_id: 0,
                pci_sub_system_id: 0,
                bus_id: [0; 32],
            };
            // SAFETY: `info` is a valid nvmlPciInfo_t to fill.
            let rc = unsafe { f(dev, &mut info) };
            (rc == NVML_SUCCESS)
                .then(|| text(&info.bus_id))
                .flatten()
                .map(|b| sysfs_bus_id(&b))
        });
        gpus.push(Gpu {
            index,
            name: name.unwrap_or_else(|| "unknown".into()),
            uuid,
            memory_total_bytes,
            pci,
        });
    }
    drop(session);
    drop(lib);
    Ok(gpus)
}

/// Arguments of `nvidia-smi` whose output [`parse_nvidia_smi`] reads: one CSV line per GPU,
/// `index, name, uuid, memory.total (MiB), pci.bus_id`.
pub const NVIDIA_SMI_ARGS: [&str; 2] = [
    "--query-gpu=index,name,uuid,memory.total,pci.bus_id",
    "--format=csv,noheader,nounits",
];

/// The GPUs in the output of `nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id
/// --format=csv,noheader,nounits` (a header line, and ` MiB` units, are tolerated). A memory
/// of `[N/A]` (GB10's unified memory) is `None`; lines that are not GPUs are skipped.
pub fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    let mut gpus = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() < 5 {
            continue;
        }
        let Ok(index) = f[0].parse::<u32>() else {
            continue;
        };
        // The name may hold a comma; the last three fields are fixed.
        let n = f.len();
        let name = f[1..n - 3].join(",");
        let na = |v: &str| v.is_empty() || v.starts_with('[') || v.eq_ignore_ascii_case("n/a");
        let uuid = (!na(f[n - 3])).then(|| f[n - 3].to_string());
        let memory_total_bytes = f[n - 2]
            .trim_end_matches("MiB")
            .trim()
            .parse::<u64>()
            .ok()
            .map(|mib| mib * 1024 * 1024);
        let pci = (!na(f[n - 1])).then(|| sysfs_bus_id(f[n - 1]));
        gpus.push(Gpu {
            index,
            name: if name.is_empty() {
                "unknown".into()
            } else {
                name
            },
            uuid,
            memory_total_bytes,
            pci,
        });
    }
    gpus
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output captured from `nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id
    /// --format=csv,noheader,nounits` on an 8 x H200 host and on a DGX Spark (GB10, unified
    /// memory: `[N/A]`). The machine these tests run on has no GPU, so only the parser is
    /// tested here, on text.
    #[test]
    fn nvidia_smi_csv_gives_count_and_memory() {
        let h200 = "0, NVIDIA H200, GPU-3f6c1a2e-9d1b-7c44-a0e1-5b2f8c9d0e11, 143771, 00000000:19:00.0\n\
                    1, NVIDIA H200, GPU-7a0b2c3d-4e5f-6071-8293-a4b5c6d7e8f9, 143771, 00000000:3B:00.0\n";
        let g = parse_nvidia_smi(h200);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].name, "NVIDIA H200");
        assert_eq!(g[1].index, 1);
        assert_eq!(g[0].memory_total_bytes, Some(143_771 * 1024 * 1024));
        assert_eq!(g[1].pci.as_deref(), Some("0000:3b:00.0"));
        assert_eq!(
            g[0].uuid.as_deref(),
            Some("GPU-3f6c1a2e-9d1b-7c44-a0e1-5b2f8c9d0e11")
        );

        let spark =
            "0, NVIDIA GB10, GPU-11111111-2222-3333-4444-555555555555, [N/A], 0000000F:01:00.0\n";
        let g = parse_nvidia_smi(spark);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].memory_total_bytes, None);
        assert_eq!(g[0].name, "NVIDIA GB10");

        // With a header and units (a user's own `--format=csv`), and noise.
        let with_header = "index, name, uuid, memory.total [MiB], pci.bus_id\n\
                           0, NVIDIA A100-SXM4-80GB, GPU-aa, 81920 MiB, 00000000:07:00.0\n\
                           No devices were found\n";
        let g = parse_nvidia_smi(with_header);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].memory_total_bytes, Some(81_920 * 1024 * 1024));
        assert!(parse_nvidia_smi("No devices were found\n").is_empty());
        assert!(parse_nvidia_smi("").is_empty());
    }

    #[test]
    fn an_absent_library_is_no_gpus() {
        let e = gpus_from("libweft-no-such-nvml.so.1").unwrap_err();
        assert!(e.contains("libweft-no-such-nvml"), "{e}");
    }

    #[test]
    fn bus_ids() {
        assert_eq!(sysfs_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(sysfs_bus_id("0000:01:00.0"), "0000:01:00.0");
        assert_eq!(sysfs_bus_id("00010000:01:00.0"), "00010000:01:00.0");
    }

    #[test]
    fn text_stops_at_nul() {
        let mut buf = [0 as c_char; 8];
        for (i, b) in b"H200".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(text(&buf).as_deref(), Some("H200"));
        assert_eq!(text(&[0; 4]), None);
    }
}
