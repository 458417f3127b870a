// SPDX-License-Identifier: GPL-2.0
/*
 * modstage oracle test module. Its name (msorc_00000) is rewritten in place to a unique
 * name per differential case, so hundreds of variants load in one boot without EEXIST.
 * The allocated section .zdecoy is placed before .modinfo; a case clears its SHF_ALLOC and
 * renames it ".modinfo" to make a decoy the kernel skips (find_sec takes SHF_ALLOC only).
 */
#include <linux/init.h>
#include <linux/module.h>

asm(".section .zdecoy,\"a\",@progbits\n"
    ".asciz \"vermagic=0.0.0-decoy SMP preempt mod_unload modversions \"\n"
    ".asciz \"name=decoy\"\n"
    ".previous\n");

static int __init msorc_init(void)
{
	return 0;
}

static void __exit msorc_exit(void)
{
}

module_init(msorc_init);
module_exit(msorc_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage oracle case");
