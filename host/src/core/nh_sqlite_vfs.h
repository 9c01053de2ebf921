/* A sqlite VFS over the default one that writes a transaction's WAL frames together.
 *
 * sqlite writes each WAL frame with two write calls (its 24-byte header, then the page),
 * so a commit of 50 pages costs 100 pwrite syscalls: on this project's store that was
 * most of a COMMIT's time and an eighth of the host's CPU (docs/architecture.md, "Where an
 * event's CPU goes"). The shim gathers contiguous writes to a `-wal` file in a buffer and
 * hands them down as one write, at the latest when the page of a commit frame (a frame
 * header whose "database size" field is not zero) has been written, so a commit's frames
 * are all in the file before sqlite publishes the commit in the wal-index, exactly as
 * without the shim, and a failed write is a failed commit. Anything else asked of the file
 * (read, size, sync, truncate) writes the buffer first. What a transaction that did not
 * commit leaves in the buffer is dropped when its connection lets the WAL write lock go
 * (the database file is wrapped to see that) or closes the file: it must never land over
 * the frames another connection commits at the same offsets. A -wal file written without
 * a lock the shim can see (exclusive locking mode) is written as it comes. Journals and
 * temporary files are the default VFS's, untouched. */
#ifndef NH_SQLITE_VFS_H
#define NH_SQLITE_VFS_H

#include <stdint.h>

/* Registers the shim as the default VFS (once; thread-safe). NH_OK or NH_EFAIL. */
int nh_sqlite_vfs_install(void);

/* Writes sqlite asked of WAL files, and writes handed to the VFS below for them, since start. */
void nh_sqlite_vfs_counts(uint64_t *asked, uint64_t *done);
/* Bytes of transactions that did not commit, dropped from buffers since start. */
uint64_t nh_sqlite_vfs_dropped(void);

#endif
