// Force-included into ggml-vulkan only when the system's Vulkan headers are older than 1.3.261
// (Debian 12 ships 1.3.239). ggml's Vulkan backend always chains a VkLayerSettingsCreateInfoEXT
// (VK_EXT_layer_settings) into vkCreateInstance, and enables the extension only when the user asks
// for validation; these definitions have the layout and structure type of the real ones, so the
// instance is created exactly as with newer headers. Nothing else in ggml is changed.
#pragma once

#include <cstdint>
#include <vector>
#include <vulkan/vulkan.hpp>

#if VK_HEADER_VERSION < 261
namespace vk {

enum class LayerSettingTypeEXT : int32_t { eBool32 = 0 };

struct LayerSettingEXT {  // = VkLayerSettingEXT
    const char* pLayerName;
    const char* pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void* pValues;
};

struct LayerSettingsCreateInfoEXT {  // = VkLayerSettingsCreateInfoEXT
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
    const void* pNext = nullptr;
    uint32_t settingCount;
    const LayerSettingEXT* pSettings;
};

}  // namespace vk
#endif
