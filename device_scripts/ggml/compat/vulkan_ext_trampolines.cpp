// Linked into layerdiff-ggml only with Vulkan headers older than 1.3.261 (see vulkan_layer_settings.hpp):
// there ggml-vulkan's vulkan.hpp calls two extension functions through the static dispatcher, and the
// Vulkan loader (libvulkan.so.1) exports no extension functions. These forward to the device's own
// entry points, which is what the dynamic dispatcher does with newer headers.
#include <vulkan/vulkan.h>

extern "C" {

VKAPI_ATTR VkResult VKAPI_CALL vkGetPipelineExecutableStatisticsKHR(VkDevice device,
                                                                    const VkPipelineExecutableInfoKHR* info,
                                                                    uint32_t* count,
                                                                    VkPipelineExecutableStatisticKHR* statistics) {
    auto fn = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
        vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
    return fn ? fn(device, info, count, statistics) : VK_ERROR_EXTENSION_NOT_PRESENT;
}

VKAPI_ATTR VkResult VKAPI_CALL vkGetMemoryHostPointerPropertiesEXT(VkDevice device,
                                                                   VkExternalMemoryHandleTypeFlagBits type,
                                                                   const void* pointer,
                                                                   VkMemoryHostPointerPropertiesEXT* properties) {
    auto fn = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(device, "vkGetMemoryHostPointerPropertiesEXT"));
    return fn ? fn(device, type, pointer, properties) : VK_ERROR_EXTENSION_NOT_PRESENT;
}

}  // extern "C"
