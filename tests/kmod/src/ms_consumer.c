// SPDX-License-Identifier: GPL-2.0
/* modstage test module: imports ms_exporter_value, so it depends on ms_exporter. */
#include <linux/init.h>
#include <linux/module.h>

int ms_exporter_value(void);

static int __init ms_consumer_init(void)
{
	pr_info("ms_consumer: ms_exporter_value() = %d\n", ms_exporter_value());
	return 0;
}

static void __exit ms_consumer_exit(void)
{
}

module_init(ms_consumer_init);
module_exit(ms_consumer_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: symbol consumer");
