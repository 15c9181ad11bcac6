//! The plugin's soname: `libnccl-net-weft.so`, the name it is installed under (NCCL opens
//! `libnccl-net-<NCCL_NET_PLUGIN>.so`), so that ldconfig and Debian's checks see a shared
//! library that names itself.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net-weft.so");
}
