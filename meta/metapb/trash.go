package metapb

// TrashName is the name of the trash directory at the root of the file
// system: it lists the deleted files kept in the trash, is not listed by
// readdir of the root, and no entry of that name can be made there.
const TrashName = ".trash"

// TrashIno is the inode number of the trash directory. It has no record:
// inode numbers are handed out from 2 upwards and never reach it.
const TrashIno = 1<<63 - 2
