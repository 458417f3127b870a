// SPDX-License-Identifier: GPL-2.0
/* modstage test module: exports one symbol for ms_consumer. */
#include <linux/init.h>
#include <linux/module.h>

int ms_exporter_value(void)
{
	return 42;
}
EXPORT_SYMBOL(ms_exporter_value);

static int __init ms_exporter_init(void)
{
	return 0;
}

static void __exit ms_exporter_exit(void)
{
}

module_init(ms_exporter_init);
module_exit(ms_exporter_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: symbol exporter");
