/* group.h - a subset of another fl_peers' ranks seen as an fl_peers of its own (ranks renumbered
 * 0 .. n-1 in the order given), as MPI_Comm_split gives: the hierarchical collectives run the
 * ring inside a node and between nodes over groups of one transport. Messages name the parent's
 * ranks. Private to src/comm. */
#ifndef FLEET_GROUP_H
#define FLEET_GROUP_H

#include "peers.h"

/* A group of parent's ranks members[0 .. n-1] (distinct, in range), which must include the
 * parent's own rank. parent is borrowed: it must outlive the group. NULL with FL_ENOMEM's
 * message when out of memory. Free with fl_peers_free. */
fl_peers *fl_group_new(fl_peers *parent, const int *members, int n);

#endif /* FLEET_GROUP_H */
