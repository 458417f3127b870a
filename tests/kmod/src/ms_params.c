// SPDX-License-Identifier: GPL-2.0
/* modstage test module: two parameters visible in /sys/module/ms_params/parameters. */
#include <linux/init.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

static int count = 1;
module_param(count, int, 0444);
MODULE_PARM_DESC(count, "an integer the test bed sets at load time");

static char *label = "default";
module_param(label, charp, 0444);
MODULE_PARM_DESC(label, "a string the test bed sets at load time");

static int __init ms_params_init(void)
{
	pr_info("ms_params: count=%d label=%s\n", count, label);
	return 0;
}

static void __exit ms_params_exit(void)
{
}

module_init(ms_params_init);
module_exit(ms_params_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: module parameters");
MODULE_VERSION("1.0");
