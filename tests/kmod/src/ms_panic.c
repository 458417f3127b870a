// SPDX-License-Identifier: GPL-2.0
/* modstage test module: panics in init (boot fallback tests only, inside the VM). */
#include <linux/init.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/panic.h>

static int __init ms_panic_init(void)
{
	panic("ms_panic: deliberate panic from module init");
	return 0;
}

module_init(ms_panic_init);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: panics at load");
