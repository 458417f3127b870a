// SPDX-License-Identifier: GPL-2.0
/* modstage test module: requests one firmware file and records its size or errno. */
#include <linux/device.h>
#include <linux/err.h>
#include <linux/firmware.h>
#include <linux/init.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/platform_device.h>

static char *fw_name = "modstage/test.bin";
module_param(fw_name, charp, 0444);
MODULE_PARM_DESC(fw_name, "firmware file to request");

static int fw_size = -ENOENT;
module_param(fw_size, int, 0444);
MODULE_PARM_DESC(fw_size, "size of the loaded firmware, or a negative errno");

MODULE_FIRMWARE("modstage/test.bin");

static int __init ms_firmware_init(void)
{
	struct platform_device *pdev;
	const struct firmware *fw;
	int ret;

	pdev = platform_device_register_simple("ms_firmware", -1, NULL, 0);
	if (IS_ERR(pdev)) {
		fw_size = PTR_ERR(pdev);
		return 0;
	}
	ret = request_firmware(&fw, fw_name, &pdev->dev);
	if (ret) {
		fw_size = ret;
	} else {
		fw_size = (int)fw->size;
		release_firmware(fw);
	}
	platform_device_unregister(pdev);
	pr_info("ms_firmware: %s -> %d\n", fw_name, fw_size);
	return 0;
}

static void __exit ms_firmware_exit(void)
{
}

module_init(ms_firmware_init);
module_exit(ms_firmware_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: firmware loading");
