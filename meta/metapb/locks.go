package metapb

// LockToEOF is the end of a FileLock that runs to the end of the file (the
// kernel's OFFSET_MAX); ends past it mean the same.
const LockToEOF = 1<<63 - 1
