fn main() {
    println!("lockprobe: not yet");
}
