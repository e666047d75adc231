/* Router configuration: defaults, a JSON file (--config), then command-line flags, each key
 * overridable by a flag of the same name (`n_queue_max` <-> `--n-queue-max`). `--help` prints
 * every key with its default. */
#ifndef TANDEM_ROUTER_CONFIG_H
#define TANDEM_ROUTER_CONFIG_H

#include <stdio.h>

#include "router/router.h"

void router_config_defaults(struct router_config *c);
/* Returns 0, 1 if --help was printed (exit 0), or a negative code with e naming the key. */
int router_config_load(struct router_config *c, int argc, char **argv, struct errbuf *e) TD_MUST_CHECK;
void router_config_usage(FILE *f);

#endif
